"""The training-input checks (training_input.py) shared by `rlcoach serve` and `LocalBackend`."""

import math

import pytest

from rlcoach import SampledChoice, Trajectory, TrajectoryGroup
from rlcoach.backend.training_input import TrainingLimits, check_examples, check_groups
from rlcoach.errors import TrainingDataError
from rlcoach.trajectory.trajectories import ChatRecord

LIMITS = TrainingLimits(vocab_size=100, max_model_len=16)


def trajectory(prompt=(1, 2), sampled=(3, 4), reward=1.0, logprob=-0.5, tid="t1", policy="m@0"):
    choice = SampledChoice(
        message={"role": "assistant", "content": "x"},
        prompt_token_ids=list(prompt),
        token_ids=list(sampled),
        logprobs=[logprob] * len(sampled),
        policy=policy,
    )
    return Trajectory(id=tid, choices=[choice], reward=reward)


def test_good_groups_pass():
    check_groups([TrajectoryGroup([trajectory(), trajectory(reward=0.0)])], LIMITS)


@pytest.mark.parametrize(
    "bad,words",
    [
        (trajectory(sampled=(3, 100)), ["sampled token id 100 at position 1", "vocabulary of 100"]),
        (trajectory(prompt=(-1, 2)), ["prompt token id -1 at position 0"]),
        (trajectory(prompt=(1,) * 15, sampled=(2, 3)), ["17 tokens", "max_model_len of 16"]),
        (trajectory(reward=math.nan), ["reward nan"]),
        (trajectory(reward=math.inf), ["reward inf"]),
        (trajectory(logprob=math.nan), ["log-prob nan at position 0"]),
        (trajectory(logprob=-math.inf), ["log-prob -inf"]),
        (trajectory(logprob=-math.inf, policy="client"), ["log-prob -inf"]),
    ],
)
def test_each_problem_is_named_with_its_place_and_fix(bad, words):
    groups = [TrajectoryGroup([trajectory(tid="ok")]), TrajectoryGroup([trajectory(), bad])]
    with pytest.raises(TrainingDataError) as refused:
        check_groups(groups, LIMITS)
    message = str(refused.value)
    assert "groups[1].trajectories[1]" in message and "fix:" in message
    for word in words:
        assert word in message


def test_only_a_rendered_client_reply_may_lack_log_probs():
    # trainer/render.py writes NaN where a client-built reply recorded no log-prob
    check_groups([TrajectoryGroup([trajectory(logprob=math.nan, policy="client")])], LIMITS)


def test_sft_examples_check_trajectories_and_leave_chat_records_alone():
    record = ChatRecord(messages=[{"role": "user", "content": "hi"}])
    check_examples([record, trajectory()], LIMITS)
    with pytest.raises(TrainingDataError, match=r"examples\[1\]"):
        check_examples([record, trajectory(sampled=(500,))], LIMITS)
