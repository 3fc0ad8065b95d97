"""Distillation: a stronger model's good attempts become the policy's SFT data.

    async def attempt(model, task):                 # the same rollout code as for RL
        async with model.rollout(task=task.id) as rollout:
            reply = await model.openai_client().chat.completions.create(...)
            rollout.reward = check(task, reply)
        return rollout.trajectory

    teacher = Model("gpt-4.1", base_url=..., api_key_env="OPENAI_API_KEY")
    demos = await collect_demonstrations(teacher, attempt, tasks, samples_per_task=2)
    await policy.train_sft(demos.kept)              # a new step, served like an RL step

The teacher is any OpenAI-compatible `Model`; its conversations are captured client side
(`Model.rollout()`), as messages. The rollout function is the user's own, so it runs the
real task (tools, multi-turn) and scores it; only attempts with `reward >= min_reward` are
kept — imitating the teacher's failures would teach them. Rollouts that raise are
recorded and counted (`gather_trajectory_groups`), as in RL.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from rlcoach.errors import ConfigError
from rlcoach.rollout.gather import gather_trajectory_groups
from rlcoach.trajectory.trajectories import RolloutFailure, Trajectory, TrajectoryGroup

if TYPE_CHECKING:
    from rlcoach.config import SFTConfig
    from rlcoach.model import Model, TrainableModel

__all__ = ["Demonstrations", "collect_demonstrations", "distill"]

Task = TypeVar("Task")


@dataclass
class Demonstrations:
    """What the teacher did: the attempts kept for SFT and what was left out."""

    kept: list[Trajectory] = field(default_factory=list)
    rejected: list[Trajectory] = field(default_factory=list)
    """Attempts under `min_reward`, or with no assistant message to imitate."""
    failures: list[RolloutFailure] = field(default_factory=list)

    @property
    def attempts(self) -> int:
        return len(self.kept) + len(self.rejected) + len(self.failures)

    def summary(self) -> dict[str, float]:
        rewards = [t.reward for t in [*self.kept, *self.rejected]]
        return {
            "attempts": float(self.attempts),
            "kept": float(len(self.kept)),
            "rejected": float(len(self.rejected)),
            "failed": float(len(self.failures)),
            "teacher_reward": sum(rewards) / len(rewards) if rewards else 0.0,
        }


def _imitable(trajectory: Trajectory) -> bool:
    return any(m.get("role") == "assistant" for h in trajectory.histories() for m in h.messages)


async def collect_demonstrations(
    teacher: Model | str,
    rollout: Callable[[Model, Task], Awaitable[Trajectory]],
    tasks: Sequence[Task],
    *,
    samples_per_task: int = 1,
    min_reward: float = 1.0,
    max_concurrency: int = 16,
    max_failure_fraction: float = 0.5,
    progress: bool = True,
) -> Demonstrations:
    """Run `rollout(teacher, task)` `samples_per_task` times per task; keep the good ones.

    `teacher` is a `Model` or a `provider/model` string ("openai/gpt-4.1", providers.py)."""
    from rlcoach.providers import as_model

    teacher = as_model(teacher)
    if samples_per_task < 1:
        raise ConfigError(
            f"samples_per_task={samples_per_task!r} is below 1: each task needs a teacher "
            "sample to keep; fix: pass samples_per_task >= 1"
        )
    groups: list[TrajectoryGroup] = await gather_trajectory_groups(
        ([rollout(teacher, task) for _ in range(samples_per_task)] for task in tasks),
        max_concurrency=max_concurrency,
        max_failure_fraction=max_failure_fraction,
        progress=progress,
        description="teacher rollouts",
    )
    demos = Demonstrations()
    for group in groups:
        demos.failures += group.failures
        for trajectory in group.trajectories:
            good = trajectory.reward >= min_reward and _imitable(trajectory)
            (demos.kept if good else demos.rejected).append(trajectory)
    return demos


async def distill(
    student: TrainableModel,
    teacher: Model,
    rollout: Callable[[Model, Task], Awaitable[Trajectory]],
    tasks: Sequence[Task],
    *,
    samples_per_task: int = 1,
    min_reward: float = 1.0,
    config: SFTConfig | dict[str, Any] | None = None,
    progress: bool = True,
) -> tuple[Demonstrations, Any]:
    """Collect the teacher's good attempts and fine-tune the student on them.

    Returns the demonstrations and the SFT step's result (None when nothing was kept).
    """
    demos = await collect_demonstrations(
        teacher,
        rollout,
        tasks,
        samples_per_task=samples_per_task,
        min_reward=min_reward,
        progress=progress,
    )
    if not demos.kept:
        return demos, None
    return demos, await student.train_sft(demos.kept, config, progress=progress)
