"""The W&B sink: step metrics on a `training_step` axis, and a table of trajectories.

One W&B run per rlcoach run (`<project>/<model>`): its config is the model's training
config plus the base model; every metrics record (numbers only) is logged with
`training_step`, which `define_metric` makes the x-axis of every chart (W&B's own step
counter would count log calls, and a step's trajectories and its metrics are two calls);
and each step logs a table `trajectories` with a sample of that step's rollouts: reward,
the group's mean (so the advantage shows), the prompt's last user message, the final
answer, tool calls, the judge's explanation and the logs, the policy that sampled it.

Offline mode (`mode="offline"` or `WANDB_MODE=offline`) writes the run under the run
folder's `wandb/` and needs no account; `wandb sync` uploads it later. It runs on the sink
thread (see `rlcoach.observe.sinks`), so a slow upload never holds a step back.
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field

from rlcoach.config import parse_config
from rlcoach.errors import ConfigError
from rlcoach.observe.sinks import RunInfo
from rlcoach.trajectory.histories import content_text
from rlcoach.trajectory.timeline import timeline
from rlcoach.trajectory.trajectories import Trajectory, TrajectoryGroup
from rlcoach.validation import Config

__all__ = ["TABLE_COLUMNS", "WandbConfig", "WandbSink"]

logger = logging.getLogger(__name__)

TABLE_COLUMNS = [
    "training_step",
    "group",
    "reward",
    "group_mean_reward",
    "policy",
    "task",
    "answer",
    "tool_calls",
    "tool_errors",
    "judge",
    "logs",
    "metrics",
    "trajectory_id",
]


class WandbConfig(Config):
    """Options of `WandbSink`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    project: str | None = None
    """W&B project (default: `WANDB_PROJECT`, else the rlcoach project)."""
    entity: str | None = None
    name: str | None = None
    """Run name (default: the model's name)."""
    group: str | None = None
    tags: list[str] = Field(default_factory=list)
    mode: Literal["online", "offline", "disabled"] | None = None
    """Default: `WANDB_MODE`, else online."""
    dir: Path | None = None
    """Where W&B writes its files (default: the run folder)."""
    table_rows: int = Field(8, ge=0)
    """Trajectories per step in the table (0: no table)."""
    max_text_chars: int = Field(2000, ge=50)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more]"


def _row(step: int, number: int, mean: float, trajectory: Trajectory, limit: int) -> list[Any]:
    line = timeline(trajectory)
    users = [m for m in trajectory.messages if m.get("role") == "user"]
    answers = [m for m in trajectory.messages if m.get("role") == "assistant"]
    judge = [verdict.describe() for verdict in trajectory.verdicts]
    calls = [
        f"{c.name}({json.dumps(c.arguments)[:200]})" + (" -> error" if c.error else "")
        for c in line.tool_calls
    ]
    return [
        step,
        number,
        trajectory.reward,
        mean,
        ", ".join(trajectory.policy_versions),
        _clip(content_text(users[-1].get("content")) if users else "", limit),
        _clip(content_text(answers[-1].get("content")) if answers else "", limit),
        "\n".join(calls),
        sum(c.error for c in line.tool_calls),
        _clip(judge[-1] if judge else "", limit),
        _clip("\n".join(trajectory.logs), limit),
        json.dumps(trajectory.metrics, sort_keys=True),
        trajectory.id,
    ]


class WandbSink:
    """A `rlcoach.observe.sinks.Sink` that logs to a W&B run."""

    name = "wandb"

    def __init__(self, **options: Any) -> None:
        self.config = parse_config(WandbConfig, options)
        self.run_info: RunInfo | None = None
        self._run: Any = None

    def start(self, run: RunInfo) -> None:
        try:
            import wandb
        except ImportError as e:
            raise ConfigError(
                f"the W&B sink needs wandb ({e}); fix: pip install 'rlcoach[wandb]'"
            ) from e
        c = self.config
        self.run_info = run
        folder = c.dir or run.dir
        folder.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=c.project or os.environ.get("WANDB_PROJECT") or run.project,
            entity=c.entity,
            name=c.name or run.model,
            group=c.group,
            tags=c.tags or None,
            mode=c.mode or os.environ.get("WANDB_MODE") or "online",
            dir=str(folder),
            config={
                "rlcoach_project": run.project,
                "rlcoach_model": run.model,
                "base_model": run.base_model,
                "train": run.config,
            },
            reinit="create_new",
        )
        self._run.define_metric("training_step")
        self._run.define_metric("*", step_metric="training_step")

    @property
    def run(self) -> Any:
        """The `wandb` run (None before `start`)."""
        return self._run

    def log_trajectories(self, step: int, groups: Sequence[TrajectoryGroup]) -> None:
        if self.config.table_rows == 0:
            return
        import wandb

        rows = []
        for number, group in enumerate(groups):
            mean = sum(group.rewards) / len(group.rewards) if group.rewards else 0.0
            rows += [(number, mean, t) for t in group.trajectories]
        sample = random.Random(step).sample(rows, min(len(rows), self.config.table_rows))
        data = [
            _row(step, number, mean, t, self.config.max_text_chars)
            for number, mean, t in sorted(sample, key=lambda r: r[0])
        ]
        table = wandb.Table(columns=TABLE_COLUMNS, data=data)
        self._run.log({"trajectories": table, "training_step": step})

    def log_metrics(self, step: int, metrics: Mapping[str, Any]) -> None:
        numbers = {
            key: float(value)
            for key, value in metrics.items()
            if isinstance(value, int | float) and key not in ("step", "time")
        }
        self._run.log({**numbers, "training_step": step})

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None
