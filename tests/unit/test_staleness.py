"""Policy versions on samples, and the staleness bound that drops old ones."""

import json

import pytest

from rlcoach import ConfigError, SampledChoice, TrainConfig, Trajectory, TrajectoryGroup
from rlcoach.config import parse_config
from rlcoach.rollout.staleness import drop_stale, trajectory_version
from rlcoach.trajectory.trajectories import History, policy_version_of


def _choice(policy: str) -> SampledChoice:
    return SampledChoice(
        message={"role": "assistant", "content": "x"},
        prompt_token_ids=[1, 2],
        token_ids=[3],
        logprobs=[-0.5],
        policy=policy,
    )


def _trajectory(*policies: str, reward: float = 0.0) -> Trajectory:
    return Trajectory(choices=[_choice(p) for p in policies], reward=reward)


@pytest.mark.parametrize(
    ("name", "version"),
    [
        ("agent@3", 3),
        ("agent@0", 0),
        ("a@b@12", 12),
        ("agent", None),
        ("agent@", None),
        (None, None),
    ],
)
def test_the_version_is_the_step_of_the_served_name(name, version):
    assert policy_version_of(name) == version


def test_a_choice_carries_its_version_and_older_files_load_with_it():
    choice = _choice("agent@4")
    assert choice.policy_version == 4
    old_line = json.loads(choice.model_dump_json())
    del old_line["policy_version"]  # a file written before the field existed
    assert SampledChoice.model_validate(old_line).policy_version == 4
    assert SampledChoice.model_validate({**old_line, "policy": "base-model"}).policy_version is None


def test_a_trajectory_is_as_old_as_its_oldest_call():
    trajectory = _trajectory("agent@5", "agent@6")
    trajectory.additional_histories.append(History(choices=[_choice("agent@4")]))
    assert trajectory.policy_version == 4
    assert trajectory_version(trajectory, "agent") == 4
    assert trajectory_version(_trajectory("other@1"), "agent") is None
    assert trajectory_version(_trajectory("agent-2@1"), "agent") is None


def test_drop_stale_keeps_the_bound_and_counts_what_it_drops():
    groups = [
        TrajectoryGroup([_trajectory("agent@9"), _trajectory("agent@8"), _trajectory("agent@7")]),
        TrajectoryGroup([_trajectory("agent@5"), _trajectory("agent@10")]),
        TrajectoryGroup([_trajectory("teacher@1"), _trajectory("base")]),
    ]
    kept, staleness = drop_stale(groups, "agent", current_version=9, max_staleness=1)
    assert [[t.policy_version for t in g.trajectories] for g in kept] == [
        [9, 8],
        [10],
        [1, None],
    ]
    assert staleness.stale_dropped == 2 and staleness.unversioned == 2
    # 9 -> 0, 8 -> 1, and 10 (newer than the trainer's version) counts as fresh.
    assert staleness.staleness_max == 1 and staleness.staleness_mean == pytest.approx(1 / 3)
    assert staleness.trained_version == 9 and staleness.max_staleness == 1
    assert groups[0].trajectories[2].policy_version == 7  # the caller's groups are untouched
    _, strict = drop_stale(groups, "agent", current_version=9, max_staleness=0)
    assert strict.stale_dropped == 3


def test_max_staleness_is_validated():
    assert TrainConfig().max_staleness == 1
    with pytest.raises(ConfigError, match="max_staleness=-1"):
        parse_config(TrainConfig, {"max_staleness": -1})
