"""The online difficulty filter: keep training on inputs whose groups still teach.

GRPO learns nothing from a group whose attempts all got the same reward (all solved or
all failed): its advantages are zero. `DifficultyFilter` keeps, per input id, a rolling
estimate of the mean reward (an exponential moving average) and whether its last
`window` groups had any reward variance. `select` then drops the inputs whose last
`window` groups were all uninformative — or keeps each with `keep_probability`, so an
input the policy has since forgotten can come back — and `record` reports, per step, how
many groups were informative. Inputs never seen are always kept.

    curriculum = DifficultyFilter()
    for batch in iterate_dataset(records, batch_size=8):
        items = curriculum.select(batch.items, key=lambda r: r.id)
        groups = await gather_trajectory_groups(...)       # rollouts tag input_id
        report = curriculum.record(groups)                 # report.informative_fraction
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from rlcoach.errors import ConfigError
from rlcoach.trajectory.trajectories import TrajectoryGroup

__all__ = ["DifficultyFilter", "FilterReport", "InputEstimate", "group_input_id"]

T = TypeVar("T")


def group_input_id(group: TrajectoryGroup) -> str | None:
    """The input a group attempted: `metadata["input_id"]` of the group or its rollouts."""
    value = group.metadata.get("input_id")
    if value is None:
        value = next(
            (
                t.metadata["input_id"]
                for t in group.trajectories
                if t.metadata.get("input_id") is not None
            ),
            None,
        )
    return None if value is None else str(value)


@dataclass(slots=True)
class InputEstimate:
    """What the filter knows about one input."""

    mean_reward: float = 0.0
    """Exponential moving average of the input's group mean reward."""
    groups: int = 0
    informative: deque[bool] = field(default_factory=deque)
    """For the last `window` groups: did the rewards vary?"""

    @property
    def stale(self) -> bool:
        """True when every one of the last `window` groups was uninformative."""
        return bool(self.informative) and not any(self.informative)


@dataclass(frozen=True, slots=True)
class FilterReport:
    """One step of the filter: groups seen, how many taught something, inputs dropped."""

    groups: int
    informative: int
    untracked: int
    """Groups with no input id (they cannot be filtered)."""
    stale_inputs: int
    """Inputs the filter would now skip."""

    @property
    def informative_fraction(self) -> float:
        return self.informative / self.groups if self.groups else 0.0

    def as_metrics(self) -> dict[str, float]:
        return {
            "groups": float(self.groups),
            "informative_groups": float(self.informative),
            "informative_fraction": self.informative_fraction,
            "stale_inputs": float(self.stale_inputs),
        }


class DifficultyFilter:
    """Rolling per-input reward estimates; skips inputs that stopped teaching."""

    def __init__(
        self,
        window: int = 2,
        keep_probability: float = 0.0,
        smoothing: float = 0.5,
        min_std: float = 1e-6,
        seed: int = 0,
    ) -> None:
        if window < 1:
            raise ConfigError(f"window={window!r} must be at least 1 (groups per input)")
        if not 0.0 <= keep_probability <= 1.0:
            raise ConfigError(f"keep_probability={keep_probability!r} must be in [0, 1]")
        if not 0.0 < smoothing <= 1.0:
            raise ConfigError(f"smoothing={smoothing!r} must be in (0, 1]")
        self.window = window
        self.keep_probability = keep_probability
        self.smoothing = smoothing
        self.min_std = min_std
        self.estimates: dict[str, InputEstimate] = {}
        self._rng = random.Random(seed)

    def _informative(self, rewards: list[float]) -> bool:
        if len(rewards) < 2:
            return False
        mean = sum(rewards) / len(rewards)
        return (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5 > self.min_std

    def record(self, groups: Iterable[TrajectoryGroup]) -> FilterReport:
        """Update the estimates with one step's groups and report on them."""
        total = informative = untracked = 0
        for group in groups:
            rewards = group.rewards
            if not rewards:
                continue
            total += 1
            varied = self._informative(rewards)
            informative += varied
            input_id = group_input_id(group)
            if input_id is None:
                untracked += 1
                continue
            estimate = self.estimates.setdefault(input_id, InputEstimate())
            mean = sum(rewards) / len(rewards)
            estimate.mean_reward = (
                mean
                if estimate.groups == 0
                else (self.smoothing * mean + (1 - self.smoothing) * estimate.mean_reward)
            )
            estimate.groups += 1
            estimate.informative.append(varied)
            while len(estimate.informative) > self.window:
                estimate.informative.popleft()
        stale = sum(
            1 for e in self.estimates.values() if e.stale and len(e.informative) == self.window
        )
        return FilterReport(total, informative, untracked, stale)

    def is_stale(self, input_id: str) -> bool:
        estimate = self.estimates.get(input_id)
        return estimate is not None and estimate.stale and len(estimate.informative) == self.window

    def select(self, items: Sequence[T], key: Callable[[T], str]) -> list[T]:
        """The items to roll out now: stale inputs dropped (or kept with keep_probability)."""
        return [
            item
            for item in items
            if not self.is_stale(key(item)) or self._rng.random() < self.keep_probability
        ]
