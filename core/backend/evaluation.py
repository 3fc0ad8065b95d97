"""Evaluation records, and which checkpoints to keep by them.

`model.log(groups, split="val")` records groups that are not trained on — a validation
or test set, or a comparison model's attempts — with their numbers, at the model's
current step: the groups go to `trajectories/<split>/<step>.jsonl` and to every plug-in
sink (each group's metadata carries `split`), and one `metrics.jsonl` record with
`event: "eval"` carries `<split>/reward` (the mean, as ART names it), `<split>/reward_std`,
min and max, rollouts and failures, and `<split>/<metric>` for each trajectory metric's
mean. `rlcoach report` charts them beside the training curves.

`model.delete_checkpoints("val/reward")` then keeps the latest checkpoint (always), the
`keep_last` newest, and the `keep_best` best by that metric — any number in the run's
`metrics.jsonl` records (an eval metric, or a training one such as `reward_mean`) — and
deletes the rest: retention.py's rule, the one `rlcoach serve` applies after each step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from rlcoach.backend.retention import RetentionConfig, apply_retention, read_metric
from rlcoach.observe.sinks import rollout_metrics
from rlcoach.paths import RunPaths
from rlcoach.trajectory.trajectories import TrajectoryGroup

__all__ = ["delete_checkpoints", "eval_record"]

logger = logging.getLogger(__name__)


def eval_record(
    groups: Sequence[TrajectoryGroup], split: str, metrics: Mapping[str, float] | None = None
) -> dict[str, Any]:
    """The `metrics.jsonl` record of an evaluation (see the module docstring)."""
    numbers = rollout_metrics(groups)
    record: dict[str, Any] = {"event": "eval", "split": split}
    renamed = {
        "reward_mean": "reward",
        "rollouts": "rollouts",
        "rollout_failures": "rollout_failures",
    }
    for key, value in numbers.items():
        if key.startswith("rollout/"):
            record[f"{split}/{key.removeprefix('rollout/')}"] = value
        elif key.startswith("group/"):
            record[f"{split}/{key}"] = value
        else:
            record[f"{split}/{renamed.get(key, key)}"] = value
    for key, value in (metrics or {}).items():
        record[key if "/" in key else f"{split}/{key}"] = value
    return record


def delete_checkpoints(
    paths: RunPaths,
    latest: int,
    best_checkpoint_metric: str,
    *,
    keep_last: int = 1,
    keep_best: int = 1,
    best_mode: Literal["max", "min"] = "max",
    forget: Callable[[int], None] = lambda step: None,
) -> list[int]:
    """Delete a run's checkpoints but those retention.py's rule keeps; `forget(step)` is
    called for each deleted step (the router stops serving it). Returns them."""
    config = RetentionConfig(
        keep_last=keep_last,
        keep_best=keep_best,
        best_metric=best_checkpoint_metric,
        best_mode=best_mode,
        optimizer_keep_last=None,
        requests_keep_last=None,
        logs_keep_last=None,
    )
    if keep_best and not read_metric(paths.metrics, best_checkpoint_metric):
        logger.warning(
            "no %r in %s yet: keeping only the newest checkpoints (record it with "
            "model.log(groups, split=...) or name another metric)",
            best_checkpoint_metric,
            paths.metrics,
        )
    pruned = apply_retention(paths, config, latest)
    for step in pruned.checkpoints:
        forget(step)
    return sorted(pruned.checkpoints)
