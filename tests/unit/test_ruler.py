"""RULER without a model: rendering, orderings, cache, retries, failures, usage.

The judge here is scripted (`scripted` in conftest.py): a real HTTP server on 127.0.0.1
that answers chat completions from a Python function (the one seam faked, because a
judge that writes a chosen wrong answer on demand cannot be a real model). Everything on
our side — the OpenAI client, timeouts, the cache, parsing, retries — runs for real.
"""

import json
import math
import re
import time

import pytest

from rlcoach import ConfigError, Trajectory, TrajectoryGroup, gather_trajectory_groups
from rlcoach.config import parse_config
from rlcoach.ruler import (
    Candidate,
    JudgeError,
    JudgeUsage,
    RulerConfig,
    after_each,
    judge_usage,
    render_group,
    score,
    score_group,
)
from rlcoach.ruler.judge import AnswerError, parse_digit_answer, parse_json_answer
from rlcoach.ruler.render import render_message
from rlcoach.trajectory.trajectories import History, Verdict, tool_message

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    }
]
TASK = [
    {"role": "system", "content": "You add numbers."},
    {"role": "user", "content": "What is 2 + 3?"},
]


def attempt(answer: str) -> list[dict]:
    return [*TASK, {"role": "assistant", "content": f"answer {answer}"}]


@pytest.fixture
def judge(scripted):
    return scripted


def blocks(request: dict) -> dict[str, str]:
    """Trajectory id -> its body, as shown in the judge's prompt."""
    text = request["messages"][1]["content"]
    return dict(re.findall(r'<trajectory id="(\d+)">\n(.*?)\n</trajectory>', text, re.DOTALL))


def by_content(request: dict) -> str:
    """Score each trajectory by the number after 'answer' in its body: 'answer 7' -> 0.7."""
    scores = {
        label: {
            "explanation": f"said {body}",
            "score": int(re.search(r"answer (\d+)", body).group(1)) / 10,
        }
        for label, body in blocks(request).items()
    }
    return json.dumps(scores)


def config(tmp_path, **fields) -> RulerConfig:
    return RulerConfig(cache_dir=tmp_path / "cache", **fields)


# -- rendering -------------------------------------------------------------------------


def test_render_shows_shared_context_once_and_each_remainder():
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
    }
    with_tool = [
        *TASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "error: overflow"},
        {"role": "assistant", "content": "It is 5."},
    ]
    rendered = render_group([Candidate(with_tool, TOOLS), Candidate(attempt("6"), TOOLS)])
    assert "[user] What is 2 + 3?" in rendered.context
    assert "- add(a: integer, b: integer): Add two integers." in rendered.context
    assert all("What is 2 + 3?" not in body for body in rendered.bodies)
    assert '[assistant calls tool] add({"a": 2, "b": 3})' in rendered.bodies[0]
    assert "[tool result] error: overflow" in rendered.bodies[0]
    assert rendered.bodies[1] == "[assistant] answer 6"
    flagged = render_message(tool_message("c1", "overflow", error=True))
    assert flagged == "[tool error] overflow"  # the judge sees the flag, not only the wording


def test_render_lists_tools_per_trajectory_when_they_differ_and_extra_histories():
    other_tools = [
        {
            "name": "search",
            "description": "Search the web.",
            "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}},
        }
    ]
    sub_agent = (
        [{"role": "user", "content": "Summarise: 5"}, {"role": "assistant", "content": "five"}],
        None,
    )
    rendered = render_group(
        [Candidate(attempt("5"), TOOLS, [sub_agent]), Candidate(attempt("6"), other_tools)]
    )
    assert "Tools offered to every trajectory" not in rendered.context
    assert "- add(a: integer, b: integer)" in rendered.bodies[0]
    assert "- search(q: string): Search the web." in rendered.bodies[1]
    assert "Additional conversation 1" in rendered.bodies[0]
    assert "[user] Summarise: 5" in rendered.bodies[0]


def test_identical_trajectories_are_rendered_and_judged_once():
    rendered = render_group(
        [Candidate(attempt("5")), Candidate(attempt("6")), Candidate(attempt("5"))]
    )
    assert len(rendered.bodies) == 2
    assert rendered.index == [0, 1, 0]


def test_candidate_from_trajectory_keeps_additional_histories():
    trajectory = Trajectory(
        messages=attempt("5"), tools=TOOLS, additional_histories=[History(messages=attempt("9"))]
    )
    candidate = Candidate.from_trajectory(trajectory)
    assert candidate.tools == TOOLS
    assert [list(m) for m, _ in candidate.extra] == [attempt("9")]


# -- answers ---------------------------------------------------------------------------


def test_parse_json_answer_accepts_fences_and_string_numbers():
    content = '```json\n{"1": {"explanation": "ok", "score": "0.5"}, "2": {"score": 1}}\n```'
    assert parse_json_answer(content, 2) == {"1": (0.5, "ok"), "2": (1.0, "")}


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ('{"1": {"score": 0.5}}', r"missing \['2'\]"),
        ('{"1": {"score": 0.5}, "2": {"score": 0.1}, "3": {"score": 0}}', r"unexpected \['3'\]"),
        ('{"1": {"score": 7}, "2": {"score": 0.1}}', "score is 7; scores must be between 0 and 1"),
        ('{"1": {"score": "good"}, "2": {"score": 0.1}}', "must be a number, got 'good'"),
        ("I think the first one is better.", "contains no JSON object"),
        ('{"1": {"score": 0.5}, ', "contains no JSON object|not valid JSON"),
    ],
)
def test_parse_json_answer_says_what_is_wrong(content, problem):
    with pytest.raises(AnswerError, match=problem):
        parse_json_answer(content, 2)


def test_parse_digit_answer_is_the_expected_digit_over_digit_tokens():
    choice = {
        "logprobs": {
            "content": [
                {
                    "token": "7",
                    "logprob": math.log(0.5),
                    "top_logprobs": [
                        {"token": "7", "logprob": math.log(0.5)},
                        {"token": " 9", "logprob": math.log(0.25)},
                        {"token": "The", "logprob": math.log(0.2)},
                        {"token": "0", "logprob": math.log(0.05)},
                    ],
                }
            ]
        }
    }
    value, mass = parse_digit_answer(choice, 1e-4)
    assert mass == pytest.approx(0.8)
    assert value == pytest.approx((7 * 0.5 + 9 * 0.25) / 0.8 / 9)
    with pytest.raises(AnswerError, match="not a digit"):
        parse_digit_answer({"logprobs": {"content": [{"token": "A", "logprob": 0.0}]}}, 1e-4)


def test_bad_config_names_the_value():
    with pytest.raises(ConfigError, match="mode='xml'"):
        parse_config(RulerConfig, {"mode": "xml"})


# -- the judge over HTTP ---------------------------------------------------------------


async def test_orderings_are_shuffled_and_scores_map_back(judge, tmp_path):
    judge.answer = by_content
    conversations = [attempt(str(n)) for n in (1, 9, 4, 6, 2)]
    results = await score(conversations, judge.model, config=config(tmp_path, n_orderings=4))
    assert [r.score for r in results] == pytest.approx([0.1, 0.9, 0.4, 0.6, 0.2])
    assert [r.index for r in results] == [0, 1, 2, 3, 4]
    assert all(r.spread == 0 and len(r.ordering_scores) == 4 for r in results)
    shown = [tuple(blocks(request).values()) for request in judge.requests]
    assert len(set(shown)) > 1, "every ordering showed the trajectories in the same order"
    assert judge.requests[0]["response_format"]["json_schema"]["schema"]["required"] == [
        "1",
        "2",
        "3",
        "4",
        "5",
    ]


async def test_position_bias_shows_up_as_spread(judge, tmp_path):
    judge.answer = lambda request: json.dumps(
        {
            label: {"explanation": "", "score": 1.0 if label == "1" else 0.0}
            for label in blocks(request)
        }
    )
    results = await score(
        [attempt("1"), attempt("2"), attempt("3")],
        judge.model,
        config=config(tmp_path, n_orderings=6),
    )
    assert max(r.spread for r in results) == 1.0


async def test_a_cached_answer_costs_no_call(judge, tmp_path):
    judge.answer = by_content
    first, second = JudgeUsage(), JudgeUsage()
    conversations = [attempt("3"), attempt("8")]
    await score(conversations, judge.model, config=config(tmp_path), usage=first)
    again = await score(conversations, judge.model, config=config(tmp_path), usage=second)
    assert (first.calls, first.cached_calls) == (1, 0)
    assert (second.calls, second.cached_calls) == (0, 1)
    assert len(judge.requests) == 1
    assert [r.score for r in again] == pytest.approx([0.3, 0.8])
    await score(conversations, judge.model, rubric="Prefer 8.", config=config(tmp_path))
    assert len(judge.requests) == 2, "a different rubric must not hit the cache"


async def test_wrong_count_is_retried_with_the_problem_fed_back(judge, tmp_path):
    def answer(request):
        if len(judge.requests) == 1:
            return json.dumps({"1": {"explanation": "", "score": 0.5}})
        return by_content(request)

    judge.answer = answer
    usage = JudgeUsage()
    results = await score(
        [attempt("2"), attempt("7"), attempt("5")],
        judge.model,
        config=config(tmp_path),
        usage=usage,
    )
    assert [r.score for r in results] == pytest.approx([0.2, 0.7, 0.5])
    assert usage.retries == 1 and usage.calls == 2
    feedback = judge.requests[1]["messages"][-1]["content"]
    assert "cannot be used" in feedback and "missing ['2', '3']" in feedback


async def test_score_group_copies_rewards_keeps_originals_and_explains(judge, tmp_path):
    judge.answer = by_content
    group = TrajectoryGroup([Trajectory(messages=attempt(n), reward=0.25) for n in ("4", "9")])
    scored = await score_group(
        group, judge.model, config=config(tmp_path, price_per_million_tokens=(1.0, 2.0))
    )
    assert scored.rewards == pytest.approx([0.4, 0.9])
    assert group.rewards == [0.25, 0.25], "the input group was mutated"
    assert [t.metrics["original_reward"] for t in scored.trajectories] == [0.25, 0.25]
    assert scored.trajectories[1].verdicts == [
        Verdict(judge="ruler", score=0.9, explanation="said [assistant] answer 9")
    ]
    assert scored.trajectories[1].logs == []  # the verdict is a field, not a log line
    assert scored.metadata["ruler_calls"] == 1
    assert scored.metadata["ruler_prompt_tokens"] == 100
    assert scored.metadata["ruler_cost_usd"] == pytest.approx((100 * 1.0 + 10 * 2.0) / 1e6)
    assert judge_usage([scored, scored])["ruler_calls"] == 2


@pytest.mark.parametrize("on_failure", ["keep", "drop", "raise"])
async def test_a_judge_that_never_answers_right_is_recorded_not_fatal(judge, tmp_path, on_failure):
    judge.answer = lambda request: "I cannot decide."
    group = TrajectoryGroup(
        [Trajectory(messages=attempt(n), reward=r) for n, r in (("1", 0.0), ("2", 1.0))]
    )
    cfg = config(tmp_path, on_failure=on_failure, max_retries=2)
    if on_failure == "raise":
        with pytest.raises(JudgeError, match="no usable answer in 3 attempts"):
            await score_group(group, judge.model, config=cfg)
        return
    scored = await score_group(group, judge.model, config=cfg)
    assert len(judge.requests) == 3
    assert scored.metadata["ruler_failed"] is True
    assert "contains no JSON object" in scored.metadata["ruler_error"]
    assert scored.metadata["ruler_failed_calls"] == 1
    if on_failure == "keep":
        assert scored.rewards == [0.0, 1.0]
        [verdict] = scored.trajectories[0].verdicts
        assert verdict.judge == "ruler" and verdict.score is None
        assert "contains no JSON object" in verdict.error and "reward kept" in verdict.error
    else:
        assert scored.trajectories == []
        assert [f.type for f in scored.failures] == ["JudgeError", "JudgeError"]


async def test_a_slow_judge_times_out_instead_of_hanging(judge, tmp_path):
    judge.answer = by_content
    judge.delay_s = 3.0
    group = TrajectoryGroup([Trajectory(messages=attempt(n)) for n in ("1", "2")])
    started = time.monotonic()
    scored = await score_group(
        group, judge.model, config=config(tmp_path, timeout_s=0.3, max_retries=1)
    )
    assert time.monotonic() - started < 2.5
    assert scored.metadata["ruler_failed"] is True
    assert "request failed" in scored.metadata["ruler_error"]


async def test_probs_mode_reads_digit_probabilities_per_trajectory(judge, tmp_path):
    def answer(request):
        target = re.search(r"Trajectory (\d+)\. Score", request["messages"][-1]["content"])
        body = blocks(request)[target.group(1)]
        digit = re.search(r"answer (\d+)", body).group(1)
        return {digit: math.log(0.6), "The": math.log(0.3), "0": math.log(0.1)}

    judge.answer = answer
    results = await score(
        [attempt("9"), attempt("3")], judge.model, config=config(tmp_path, mode="probs")
    )
    assert [r.score for r in results] == pytest.approx([9 * 0.6 / 0.7 / 9, 3 * 0.6 / 0.7 / 9])
    assert all(
        request["max_tokens"] == 1 and request["top_logprobs"] == 20 for request in judge.requests
    )
    assert "probability on digits 0.70" in results[0].explanation


async def test_after_each_scores_groups_while_gathering(judge, tmp_path):
    judge.answer = by_content

    async def rollout(n: str) -> Trajectory:
        return Trajectory(messages=attempt(n))

    groups = await gather_trajectory_groups(
        [[rollout("2"), rollout("5")], [rollout("8"), rollout("1")]],
        after_each=after_each(judge.model, config=config(tmp_path)),
        progress=False,
    )
    assert [g.rewards for g in groups] == [pytest.approx([0.2, 0.5]), pytest.approx([0.8, 0.1])]


def test_the_judge_cache_is_bounded_and_counts_evictions(tmp_path):
    from rlcoach.ruler.cache import JudgeCache

    cache = JudgeCache(tmp_path, max_entries=10)
    keys = [JudgeCache.key("u", {"n": n}) for n in range(12)]
    evicted = [cache.put(key, {"n": n}) for n, key in enumerate(keys)]
    assert sum(evicted) == 2  # the 11th entry brings the cache down to 9 of 10
    assert len(list(tmp_path.glob("*/*.json"))) == 10
    assert cache.get(keys[-1]) == {"n": 11}
