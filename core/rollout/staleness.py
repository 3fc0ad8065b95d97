"""Staleness: how many policy versions old a sample is when it is trained on.

Every sampled choice carries the policy version that sampled it (`SampledChoice.
policy_version`, the `step` of the served name `name@step`). A step that turns version
`k` into `k + 1` trains a trajectory sampled by version `v` at staleness `k - v`: 0 in
the synchronous loop, up to the pipeline's lag when rollouts for the next step run while
this one trains (pipeline.py). Trajectories staler than `TrainConfig.max_staleness` are
not trained: the PPO-clip ratio against the sampler's recorded log-probs corrects a
little off-policy drift, not an arbitrary amount. They are counted in the step's
metrics (`stale_dropped`), never silently.

Rules:
- A trajectory's version is the oldest among its choices of *this* model (a multi-turn
  rollout that spans a publish is as stale as its first call).
- Choices sampled under another name (another model's `other@3`, the base model's own
  name, a teacher served elsewhere) carry no version of this model; a trajectory made
  only of them is kept as it is (counted as `unversioned`): it is data the caller chose
  to train on, such as another model's samples for distillation.
- A constrained choice recorded without log-probs (the policy endpoint left them to the
  trainer, endpoint/rescore.py) is trained only by the weights that sampled it: the
  trainer's own log-probs stand in for the sampler's, which is exact only there. Sampled
  by another version (or under another name), it stays in its trajectory, every token
  kept out of the loss, and is counted (`unscored_untrained`).
- A trajectory is dropped, not its group: the rest of the group still compares rewards
  among themselves (a group left with one trajectory has no variance and trains nothing,
  which the trainer reports as usual).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlcoach.models.served_name import ServedName
from rlcoach.trajectory.trajectories import SampledChoice, Trajectory, TrajectoryGroup

__all__ = ["Staleness", "drop_stale", "trajectory_version"]


@dataclass(frozen=True, slots=True)
class Staleness:
    """What the staleness bound did to one step's batch."""

    max_staleness: int
    """The bound in force (`TrainConfig.max_staleness`)."""
    trained_version: int
    """The policy version the step trained from (the model's step before it)."""
    stale_dropped: int = 0
    """Trajectories older than the bound: not trained."""
    unversioned: int = 0
    """Trajectories with no choice sampled by this model's versions: kept as they are."""
    unscored_untrained: int = 0
    """Constrained choices without log-probs sampled by other weights than the trained
    ones: kept out of the loss."""
    staleness_max: int = 0
    """The largest staleness among the kept versioned trajectories."""
    staleness_mean: float = 0.0
    """The mean staleness of the kept versioned trajectories."""

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


def trajectory_version(trajectory: Trajectory, model_name: str) -> int | None:
    """The oldest version of `model_name` that sampled one of the trajectory's choices."""
    versions = [
        c.policy_version
        for history in trajectory.histories()
        for c in history.choices
        if c.policy_version is not None and ServedName.split(c.policy)[0] == model_name
    ]
    return min(versions) if versions else None


def drop_stale(
    groups: list[TrajectoryGroup], model_name: str, current_version: int, max_staleness: int
) -> tuple[list[TrajectoryGroup], Staleness]:
    """The groups without trajectories staler than `max_staleness`, and what was dropped.

    `current_version` is the model's step before this training step. A version newer
    than it (a sample from a checkpoint this backend has not resumed) counts as fresh.
    """
    kept_groups = []
    dropped = unversioned = untrained = 0
    lags: list[int] = []
    for group in groups:
        kept = []
        for trajectory in group.trajectories:
            version = trajectory_version(trajectory, model_name)
            if version is None:
                unversioned += 1
                kept.append(trajectory)
                continue
            lag = max(current_version - version, 0)
            if lag > max_staleness:
                dropped += 1
                continue
            lags.append(lag)
            kept.append(trajectory)
        settled = [_unscored_settled(t, model_name, current_version) for t in kept]
        marked = sum(count for _, count in settled)
        untrained += marked
        if len(kept) == len(group.trajectories) and not marked:
            kept_groups.append(group)
        else:
            kept = [t for t, _ in settled]
            kept_groups.append(group.model_copy(update={"trajectories": kept}))
    staleness = Staleness(
        max_staleness=max_staleness,
        trained_version=current_version,
        stale_dropped=dropped,
        unversioned=unversioned,
        unscored_untrained=untrained,
        staleness_max=max(lags, default=0),
        staleness_mean=sum(lags) / len(lags) if lags else 0.0,
    )
    return kept_groups, staleness


def _unscored_settled(
    trajectory: Trajectory, model_name: str, current_version: int
) -> tuple[Trajectory, int]:
    """The trajectory with each constrained choice that has no log-probs and was sampled by
    other weights than version `current_version` of `model_name` marked forced at every
    position (never trained), and how many such choices there were."""
    count = 0

    def settled(choices: list[SampledChoice]) -> list[SampledChoice]:
        nonlocal count
        out = []
        for choice in choices:
            unknown = choice.constraint is not None and any(x != x for x in choice.logprobs)
            own = (
                choice.policy_version == current_version
                and ServedName.split(choice.policy)[0] == model_name
            )
            if unknown and not own:
                count += 1
                choice = choice.model_copy(update={"forced": list(range(len(choice.token_ids)))})
            out.append(choice)
        return out

    choices = settled(trajectory.choices)
    history_choices = [settled(h.choices) for h in trajectory.additional_histories]
    if not count:
        return trajectory, 0
    histories = [
        h.model_copy(update={"choices": c})
        for h, c in zip(trajectory.additional_histories, history_choices, strict=True)
    ]
    update = {"choices": choices, "additional_histories": histories}
    return trajectory.model_copy(update=update), count
