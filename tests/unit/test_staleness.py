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


def test_a_constrained_choice_left_to_the_trainer_is_trained_only_by_its_own_weights():
    """A constrained choice recorded without log-probs (endpoint/rescore.py) is trained by
    the trainer's own log-probs, exact only at the weights that sampled it: sampled by
    another version or name, it is kept out of the loss, counted, and its trajectory and
    group stay (the rest of it still trains)."""
    nan = float("nan")

    def left(policy: str) -> SampledChoice:
        return SampledChoice(
            message={"role": "assistant", "content": '{"a": 1}'},
            prompt_token_ids=[1, 2],
            token_ids=[3, 4, 5],
            logprobs=[nan, nan, nan],
            forced=[0],
            constraint="tool_choice=required",
            policy=policy,
        )

    own = Trajectory(choices=[left("agent@3"), _choice("agent@3")], reward=1.0)
    older = Trajectory(choices=[left("agent@2"), _choice("agent@3")], reward=0.0)
    other = Trajectory(choices=[left("base-model")], reward=0.0)
    other.additional_histories.append(History(choices=[left("agent@4")]))
    groups = [TrajectoryGroup([own, older]), TrajectoryGroup([other])]
    kept, staleness = drop_stale(groups, "agent", current_version=3, max_staleness=1)
    assert staleness.unscored_untrained == 3 and staleness.stale_dropped == 0
    assert staleness.as_dict()["unscored_untrained"] == 3  # in the step's metrics
    [mine, theirs], [stranger] = (g.trajectories for g in kept)
    assert mine is own and mine.choices[0].forced == [0]  # its own weights: trained as is
    assert theirs.choices[0].forced == [0, 1, 2] and theirs.choices[1] == older.choices[1]
    assert stranger.choices[0].forced == [0, 1, 2]
    assert stranger.additional_histories[0].choices[0].forced == [0, 1, 2]
    assert older.choices[0].forced == [0]  # the caller's trajectories are not changed


def test_max_staleness_is_validated():
    assert TrainConfig().max_staleness == 1
    with pytest.raises(ConfigError, match="max_staleness=-1"):
        parse_config(TrainConfig, {"max_staleness": -1})
