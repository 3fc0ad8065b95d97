"""Weights & Biases (`rlcoach.integrations.wandb`, extra `[wandb]`): charts and tables.

A sink plug-in (`rlcoach.observe.sinks`): every step's metrics on a `training_step` axis, the
training config as the run's config, and a table of sampled trajectories per step.

    LocalBackend(sinks=["wandb"])                                   # online, your login
    LocalBackend(sinks={"plugins": {"wandb": {"mode": "offline"}}})  # files only

Importing this package does not import wandb; the sink loads it when it starts.
"""

from rlcoach.integrations.wandb.sink import TABLE_COLUMNS, WandbConfig, WandbSink

__all__ = ["TABLE_COLUMNS", "WandbConfig", "WandbSink"]
