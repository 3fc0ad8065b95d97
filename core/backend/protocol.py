"""The Backend protocol: what a `TrainableModel` needs from any backend, and its results.

`LocalBackend` (local.py) serves and trains on this machine; `RemoteBackend`
(serve/remote.py) speaks the same protocol over HTTP to `rlcoach serve`, so user code
switches between them by one line. A training step returns a `StepResult`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from rlcoach.config import TrainConfig
    from rlcoach.model import TrainableModel
    from rlcoach.paths import RunPaths
    from rlcoach.rollout.staleness import Staleness
    from rlcoach.trainer.base import SFTStats, StepStats
    from rlcoach.trajectory.exchange import Exchange
    from rlcoach.trajectory.trajectories import TrajectoryGroup

__all__ = ["Backend", "StepResult"]


@runtime_checkable
class Backend(Protocol):
    """What a `TrainableModel` needs from a backend: local (`LocalBackend`) or remote."""

    @property
    def url(self) -> str:
        """Base URL of the policy endpoint (OpenAI-compatible under `/v1`)."""

    @property
    def api_key(self) -> str:
        """The key to send to the policy endpoint."""

    async def register(self, model: TrainableModel) -> None:
        """Serve `model` (resuming from its latest checkpoint) and set `model.step`."""

    async def train(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        config: TrainConfig | dict[str, Any] | None = None,
    ) -> StepResult:
        """One step on `groups`; returns once the new adapter is served."""

    async def take_exchanges(self, rollout_id: str) -> list[Exchange]:
        """The exchanges recorded for a rollout id (each returned once)."""

    def paths(self, model: TrainableModel) -> RunPaths:
        """Folders for the model's files on the machine that runs the user code."""

    async def delete_checkpoints(
        self,
        model: TrainableModel,
        best_checkpoint_metric: str = "val/reward",
        *,
        keep_last: int = 1,
        keep_best: int = 1,
        best_mode: Literal["max", "min"] = "max",
    ) -> list[int]:
        """Delete the model's old checkpoints but the latest, the `keep_last` newest and
        the `keep_best` best by the metric (evaluation.py); return the deleted steps."""

    async def close(self) -> None:
        """Release what the backend holds (engine, connections)."""


@dataclass(frozen=True, slots=True)
class StepResult:
    """What `train()` did: the new step, the trainer's stats, publish timings."""

    step: int
    stats: StepStats | SFTStats
    checkpoint: Path | None
    publish_seconds: float
    save_seconds: float
    staleness: Staleness | None = None
    """What the staleness bound dropped (staleness.py); None for SFT."""
    timings: dict[str, float] = field(default_factory=dict)
    """Phases of the step beside training, in seconds: `sleep_seconds` and
    `wake_seconds` of a sleeping engine (colocation.py)."""
    rendering: dict[str, float] = field(default_factory=dict)
    """Client-built trajectories rendered for this step (trainer/render.py): how many,
    tokens re-tokenized, tokens without sampler log-probs."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "publish_seconds": self.publish_seconds,
            "save_seconds": self.save_seconds,
            **self.timings,
            **(self.staleness.as_dict() if self.staleness is not None else {}),
            **self.stats.as_dict(),
            **self.rendering,
        }

    @property
    def metrics(self) -> dict[str, Any]:
        """The step's numbers (ART's `TrainResult.metrics`): `as_dict()` without `step`."""
        return {k: v for k, v in self.as_dict().items() if k != "step"}

    @property
    def checkpoint_path(self) -> str | None:
        """The new checkpoint's folder as a string (ART's name), None if nothing trained."""
        return None if self.checkpoint is None else str(self.checkpoint)
