"""RULER with a real judge: the bundled model behind the policy endpoint (the session's
vLLM server), over real HTTP, in both scoring modes."""

import json

import pytest

from rlcoach import BUNDLED_MODEL, Model, gather_trajectory_groups
from rlcoach.demo.task import ADD_TOOL, RUBRIC, Question, run_question
from rlcoach.ruler import JudgeUsage, RulerConfig, after_each, score

pytestmark = pytest.mark.vllm

QUESTION = Question(123, 456)


def _attempt(arguments: dict | None, final: str) -> list[dict]:
    messages = QUESTION.messages()
    if arguments is None:
        return [*messages, {"role": "assistant", "content": final}]
    call = {
        "id": "call_9",
        "type": "function",
        "function": {"name": "add", "arguments": json.dumps(arguments)},
    }
    result = str(sum(arguments.values()))
    return [
        *messages,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_9", "content": result},
        {"role": "assistant", "content": final},
    ]


CONVERSATIONS = [
    _attempt({"a": 123, "b": 456}, "123 + 456 = 579"),
    _attempt({"a": 12, "b": 45}, "12 + 45 = 57"),
    _attempt(None, "I think it is about 600."),
]


@pytest.fixture(scope="module")
def judge(policy):
    """The base weights, served by the same endpoint as the policy."""
    return Model(BUNDLED_MODEL, base_url=policy.api_base)


@pytest.mark.parametrize("mode", ["json", "probs"])
async def test_the_bundled_model_scores_every_trajectory(judge, mode, tmp_path):
    usage = JudgeUsage()
    config = RulerConfig(mode=mode, cache_dir=tmp_path, explanation_max_chars=60)
    results = await score(
        CONVERSATIONS, judge, rubric=RUBRIC, tools=[ADD_TOOL], config=config, usage=usage
    )
    assert [r.index for r in results] == [0, 1, 2]
    assert all(0.0 <= r.score <= 1.0 for r in results)
    assert usage.failed_calls == 0 and usage.prompt_tokens > 0
    assert usage.calls == (1 if mode == "json" else 3) + usage.retries
    if mode == "probs":
        assert all("probability on digits" in r.explanation for r in results)
    again = JudgeUsage()
    await score(CONVERSATIONS, judge, rubric=RUBRIC, tools=[ADD_TOOL], config=config, usage=again)
    assert again.calls == 0 and again.cached_calls == usage.calls


async def test_judging_real_rollouts_as_they_finish(policy, judge, tmp_path):
    client = policy.openai_client()
    hook = after_each(judge, rubric=RUBRIC, config={"mode": "probs", "cache_dir": tmp_path})
    (group,) = await gather_trajectory_groups(
        [[run_question(policy, client, QUESTION) for _ in range(3)]],
        after_each=hook,
        progress=False,
    )
    assert group.metadata["ruler_failed"] is False
    assert group.metadata["ruler_calls"] >= 1
    for trajectory in group.trajectories:
        assert 0.0 <= trajectory.reward <= 1.0
        assert trajectory.reward == trajectory.metrics["ruler_score"]
        assert "original_reward" in trajectory.metrics
        [verdict] = trajectory.verdicts
        assert verdict.judge == "ruler" and verdict.score == trajectory.reward


async def test_judge_calls_inside_a_rollout_are_not_recorded_into_it(policy, judge, tmp_path):
    async with policy.rollout() as rollout:
        await score(CONVERSATIONS[:2], judge, config={"mode": "probs", "cache_dir": None})
    assert rollout.trajectory.choices == []
    assert rollout.trajectory.additional_histories == []
