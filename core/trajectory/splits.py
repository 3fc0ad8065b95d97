"""Named splits of trajectory groups: `train`, and the ones that are only logged.

`model.log(groups, split="val")` records groups that are not trained on (a validation or
test set, a comparison model's attempts). A split's name becomes a folder
(`trajectories/<split>/`) and a metric prefix (`<split>/reward`), so it is checked here,
once, for every caller (`TrainableModel.log`, `rlcoach serve`'s log route); and what
ART's `log` accepts (trajectories, exceptions, or groups) becomes groups here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from rlcoach.errors import ConfigError
from rlcoach.trajectory.trajectories import Trajectory, TrajectoryGroup

__all__ = ["as_groups", "check_split"]

_SPLIT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def check_split(split: str) -> str:
    """A split name is one safe path component (it names a folder of trajectories)."""
    if not isinstance(split, str) or not _SPLIT.match(split):
        raise ConfigError(
            f"split {split!r} is not a usable split name: it names the folder "
            "trajectories/<split>/ and prefixes the metrics; fix: use letters, digits, '_' "
            "or '-' (e.g. 'val', 'test')"
        )
    return split


def as_groups(items: Iterable[Any]) -> list[TrajectoryGroup]:
    """Trajectories (and exceptions) as one group, or groups as they are (ART's `log`)."""
    items = list(items)
    if any(isinstance(x, Trajectory | BaseException) for x in items):
        return [TrajectoryGroup(items)]
    groups = []
    for item in items:
        if not isinstance(item, TrajectoryGroup):
            raise ConfigError(
                f"model.log got a {type(item).__name__}; fix: pass trajectories or "
                "trajectory groups (e.g. the result of gather_trajectory_groups)"
            )
        if item.pending:
            raise ConfigError(
                "model.log got a TrajectoryGroup whose rollouts have not run; fix: pass the "
                "groups that `await gather_trajectory_groups(...)` returns"
            )
        groups.append(item)
    return groups
