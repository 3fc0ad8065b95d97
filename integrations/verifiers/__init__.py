"""`verifiers` environments (`rlcoach.integrations.verifiers`, extra `[verifiers]`): train any
environment written for Prime Intellect's `verifiers` as it is.

    from rlcoach.integrations.verifiers import EnvTrainConfig, train_environment
    run = await train_environment(EnvTrainConfig(env="my_env.py", steps=8))

    rlcoach env train my_env.py --env-args '{"difficulty": "easy"}' --steps 8
    rlcoach env eval my_env.py            # the environment's own metrics, base and trained

The environment is loaded with its own `load_environment()` (`load`); its dataset gives
the scenarios and its eval split the held-out set (`rows`); its own rollout loop runs with
an OpenAI client on the policy endpoint, inside an rlcoach rollout scope, so every call is
recorded with its exact tokens (single-turn, multi-turn, tool and MCP environments alike);
its rubric scores each group (`GroupRunner`). See docs/environments.md.
"""

from rlcoach.integrations.verifiers.environment import EnvironmentLoadError, load, rows
from rlcoach.integrations.verifiers.rollout import GroupRunner, verifiers_client
from rlcoach.integrations.verifiers.train import (
    EnvEvaluation,
    EnvRun,
    EnvTrainConfig,
    evaluate_environment,
    train_environment,
)

__all__ = [
    "EnvEvaluation",
    "EnvRun",
    "EnvTrainConfig",
    "EnvironmentLoadError",
    "GroupRunner",
    "evaluate_environment",
    "load",
    "rows",
    "train_environment",
    "verifiers_client",
]
