"""Trajectories go to disk and come back without loss; bad choices are refused."""

import pytest

from rlcoach import (
    History,
    RolloutFailure,
    SampledChoice,
    Trajectory,
    TrajectoryGroup,
    load_groups,
    save_groups,
)
from rlcoach.trajectory.trajectories import choice_from_response_json


def _choice(policy="agent@3", tokens=(5, 6, 2)):
    return SampledChoice(
        message={
            "role": "assistant",
            "content": "héllo",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        finish_reason="tool_calls",
        prompt_token_ids=[1, 2, 3],
        token_ids=list(tokens),
        logprobs=[-0.5, -1.25, -1e-9][: len(tokens)],
        policy=policy,
    )


def test_roundtrip_is_lossless(tmp_path):
    trajectory = Trajectory(
        messages=[{"role": "user", "content": "hi"}],
        tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        choices=[_choice()],
        additional_histories=[History(messages=[], choices=[_choice("agent@2", (9,))])],
        reward=0.75,
        metrics={"success": 1.0},
        metadata={"task": "t1", "n": 3, "ok": True},
        logs=["judge: fine"],
    )
    group = TrajectoryGroup(
        [trajectory], failures=[RolloutFailure(type="E", message="m")], metadata={"split": "train"}
    )
    path = save_groups(tmp_path / "step" / "000001.jsonl", [group, TrajectoryGroup()])
    loaded = load_groups(path)
    assert loaded == [group, TrajectoryGroup()]
    assert loaded[0].trajectories[0].policy_versions == ["agent@2", "agent@3"]
    assert loaded[0].trajectories[0].sampled_token_count() == 4
    assert not list(path.parent.glob(".*"))  # no temp file left behind


def test_choice_needs_one_logprob_per_token():
    with pytest.raises(ValueError, match="3 token ids but 2 logprobs"):
        SampledChoice(
            message={}, prompt_token_ids=[1], token_ids=[1, 2, 3], logprobs=[0.0, 0.0], policy="p"
        )


def test_completion_without_token_ids_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"model\.openai_client\(\)"):
        choice_from_response_json({"message": {"content": "x"}}, {"model": "gpt"})


def test_choice_from_policy_endpoint_json():
    response = {"model": "agent@1", "prompt_token_ids": [1, 2]}
    choice = choice_from_response_json(
        {
            "message": {"role": "assistant", "content": "ok", "refusal": None},
            "finish_reason": "stop",
            "token_ids": [7, 2],
            "logprobs": {"content": [{"token": "ok", "logprob": -0.1}, {"logprob": -0.2}]},
        },
        response,
    )
    assert choice.message == {"role": "assistant", "content": "ok"}
    assert choice.logprobs == [-0.1, -0.2]
    assert choice.policy == "agent@1"


def test_corrupt_line_names_file_and_line(tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_text(TrajectoryGroup().model_dump_json() + "\n{not json\n")
    with pytest.raises(ValueError, match=r"g\.jsonl:2"):
        load_groups(path)
