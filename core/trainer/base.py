"""The trainer protocol, and what a step returns: torch-free, so the HTTP client has them.

`Trainer` is what `LocalBackend` needs from a trainer: one RL step on scored groups, the
adapter and optimizer state written into a checkpoint folder and read back, and a close.
Two trainers implement it: `LoraTrainer` (one process, trainer/lora.py) and
`DistributedTrainer` (torchrun ranks, trainer/distributed.py). `StepStats` and
`SFTStats` are plain numbers, and this module imports neither torch nor the trainers, so
`RemoteBackend` (remote.py) rebuilds a server's step result without loading torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from rlcoach.config import TrainConfig
    from rlcoach.trajectory.trajectories import TrajectoryGroup

__all__ = ["SFTStats", "StepStats", "Trainer"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StepStats:
    """What one RL step did (plain numbers, ready for a metrics sink)."""

    trained: bool
    """False when nothing was trained: no group had reward variance, or a value was not
    finite (`non_finite`)."""
    groups: int
    groups_skipped_no_variance: int
    trajectories: int
    """Trajectories trained on (those of the groups with variance)."""
    sequences: int
    sampled_tokens: int
    """Tokens the loss is taken over (sampled by the policy)."""
    total_tokens: int
    """All tokens of the sequences, prompts and tool results included."""
    loss: float
    """Mean over mini-batches of each mini-batch's loss."""
    grad_norm: float
    """Mean over mini-batches of the gradient norm before clipping."""
    clip_fraction: float
    """Share of sampled tokens whose ratio was clipped."""
    kl: float
    """Mean KL estimate to the base model per sampled token (0 when `kl_coef` is 0)."""
    mean_ratio: float
    """Mean probability ratio new/behaviour per sampled token."""
    seconds: float
    non_finite: int = 0
    """The mini-batch (1, 2, ...) whose loss or gradient norm was not finite, which
    stopped the step before its optimizer update (`trained` is then False and nothing is
    saved or published); 0 when every value was finite."""
    optimizer_steps: int = 0
    """Optimizer updates the step ran: one per mini-batch, fewer when a non-finite value
    stopped it. A step that is not committed after any update left the trainer ahead of
    its checkpoint, and the backend makes the trainer again from that checkpoint."""
    mismatch_abs_mean: float = 0.0
    """Sampler/trainer mismatch on the trained tokens at the weights that sampled them
    (objective.py): mean |trainer - sampler| log-prob,"""
    mismatch_abs_max: float = 0.0
    """its largest value,"""
    mismatch_kl_k3: float = 0.0
    """the k3 estimate of KL(sampler || trainer) per token,"""
    mismatch_beyond_fraction: float = 0.0
    """and the share of tokens beyond `TrainConfig.mismatch_threshold`."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class SFTStats:
    """What one SFT run did (plain numbers, ready for a metrics sink)."""

    trained: bool
    examples: int
    sequences: int
    optimizer_steps: int
    trained_tokens: int
    total_tokens: int
    loss_first: float
    """Mean NLL per trained token of the first optimizer step (before it updated)."""
    loss_last: float
    """The same for the last optimizer step."""
    loss: float
    """Mean over all optimizer steps."""
    grad_norm: float
    seconds: float
    non_finite: int = 0
    """The optimizer step (1, 2, ...) whose loss or gradient norm was not finite, which
    stopped the run (`trained` is then False, `optimizer_steps` the updates before it,
    and nothing is saved or published); 0 when every value was finite."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class Trainer(Protocol):
    """A LoRA trainer for one model: what `LocalBackend` calls between gathers."""

    @property
    def closed(self) -> bool:
        """True once the trainer can take no more commands (closed, or its ranks died):
        the backend then makes a new one from the latest checkpoint."""

    def step(self, groups: list[TrajectoryGroup], config: TrainConfig | None = None) -> StepStats:
        """One RL step on `groups` (`config` overrides the trainer's for this step)."""

    def save_adapter(self, folder: Path, serving: bool = False) -> None:
        """Write the peft adapter into `folder` (all an engine needs to serve it);
        `serving`: in the base weights' dtype, the one the engine serves, for the engine
        alone (the checkpoint keeps the trainer's own)."""

    def save_optimizer(self, folder: Path) -> None:
        """Write the optimizer state into `folder`, atomically."""

    def save(self, folder: Path) -> None:
        """`save_adapter`, then `save_optimizer`."""

    def load(self, folder: Path) -> None:
        """Resume adapter weights and optimizer state from a checkpoint folder; raises
        `CheckpointError` (with the fix) for one that is missing or does not fit."""

    def close(self) -> None:
        """Release what the trainer holds (a distributed trainer's ranks)."""
