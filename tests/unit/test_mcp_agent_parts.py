"""The MCP agent's pure parts: example arguments, truncation, the default check, step
summaries, and the command line's parsing of servers, examples and checks."""

import json

import pytest
import typer

from rlcoach.autorl.grounded import cut_result
from rlcoach.errors import ConfigError
from rlcoach.integrations.mcp.agent import (
    AgentRun,
    CallRecord,
    example_arguments,
    tool_use_check,
)
from rlcoach.integrations.mcp.cli import read_examples, server_spec
from rlcoach.integrations.mcp.discovery import load_check
from rlcoach.integrations.mcp.train import summarize
from rlcoach.trajectory.trajectories import SampledChoice, Trajectory, TrajectoryGroup


def test_example_arguments_prefer_what_the_schema_says():
    schema = {
        "type": "object",
        "required": ["tz", "n", "mode", "who", "tags"],
        "properties": {
            "tz": {"type": "string", "description": "IANA name (e.g., 'Europe/London')."},
            "n": {"type": "integer", "minimum": 3},
            "mode": {"enum": ["fast", "slow"]},
            "who": {
                "type": "object",
                "required": ["email"],
                "properties": {"email": {"type": "string"}},
            },
            "tags": {"type": "array", "items": {"type": "string", "default": "x"}},
            "unused": {"type": "string"},
        },
    }
    assert example_arguments(schema) == {
        "tz": "Europe/London",
        "n": 3,
        "mode": "fast",
        "who": {"email": "ada@example.com"},
        "tags": ["x"],
    }
    # nothing required: one argument anyway, so the example shows how arguments look
    assert example_arguments({"properties": {"q": {"type": "string", "default": ""}}}) == {"q": ""}
    assert example_arguments({"type": "object", "properties": {}}) == {}


def test_cut_result_marks_the_cut_and_keeps_the_limit():
    assert cut_result("short", 40) == "short"
    cut = cut_result("y" * 500, 80)
    assert len(cut) <= 80 and cut.startswith("y") and "more characters cut" in cut
    assert str(500 - cut.index("\n")) in cut


def test_tool_use_check_rewards_a_clean_successful_call_then_an_answer():
    def run(*outcomes, answer="done"):
        return AgentRun("task", [], [CallRecord("t", "{}", o) for o in outcomes], answer)

    assert tool_use_check(run("ok")) == 1.0
    assert tool_use_check(run("ok", answer=None)) == pytest.approx(0.7)
    assert tool_use_check(run("rejected", "ok")) == pytest.approx(0.8)
    assert tool_use_check(run("tool_error")) == pytest.approx(0.1)  # tried the format
    assert tool_use_check(run("rejected", "timeout")) == pytest.approx(0.1)
    assert tool_use_check(run()) == 0.0  # answered without a tool


def test_summarize_counts_failures_as_unsuccessful_and_rates_per_call():
    done = Trajectory(
        reward=1.0,
        metrics={"success": 1.0, "tool_calls": 2.0, "tool_errors": 1.0, "invalid_calls": 0.0},
    )
    none = Trajectory(reward=0.0, metrics={"success": 0.0, "tool_calls": 0.0})
    group = TrajectoryGroup([done, none], failures=[{"type": "ToolTimeoutError", "message": "m"}])
    s = summarize([group])
    assert s["rollouts"] == 3 and s["failed"] == 1
    assert s["success"] == pytest.approx(1 / 3) and s["tool_error_rate"] == 0.5
    assert s["sampled_nll"] == 0.0  # no sampled tokens recorded


def test_summarize_reports_the_sampled_tokens_mean_negative_log_probability():
    choice = SampledChoice(
        message={"role": "assistant", "content": "ab"},
        policy="agent@1",
        prompt_token_ids=[1],
        token_ids=[5, 6, 7],
        logprobs=[-0.5, -1.5, -9.0],
        forced=[2],  # a constraint's token: not the policy's choice
    )
    sampled = Trajectory(reward=0.5, choices=[choice], metrics={"success": 0.0})
    assert summarize([TrajectoryGroup([sampled])])["sampled_nll"] == pytest.approx(1.0)


def test_server_options_need_exactly_one_transport_and_well_formed_pairs():
    spec = server_spec("mcp-server-time --local-timezone Etc/UTC", None, None, ["TZ=UTC"])
    assert spec.command == ["mcp-server-time", "--local-timezone", "Etc/UTC"]
    assert spec.env == {"TZ": "UTC"}
    http = server_spec(None, "http://127.0.0.1:9/mcp", ["Authorization: Bearer a:b"], None)
    assert http.headers == {"Authorization": "Bearer a:b"}
    for bad in [
        (None, None, None, None),
        ("x", "http://h/mcp", None, None),
        (None, "http://h/mcp", ["no-colon"], None),
        ("x", None, None, ["NOVALUE"]),
        ("x", None, ["A: b"], None),
    ]:
        with pytest.raises(typer.BadParameter):
            server_spec(*bad)


def test_secrets_can_come_from_the_environment_not_the_command_line(monkeypatch):
    monkeypatch.setenv("MCP_TEST_TOKEN", "Bearer s3cret")
    monkeypatch.setenv("MCP_TEST_TZ", "UTC")
    http = server_spec(
        None, "http://h/mcp", None, None, header_env=["Authorization=MCP_TEST_TOKEN"]
    )
    assert http.headers == {"Authorization": "Bearer s3cret"}
    spec = server_spec("mcp-server-time", None, None, ["MCP_TEST_TZ"])
    assert spec.env == {"MCP_TEST_TZ": "UTC"}
    with pytest.raises(typer.BadParameter, match="MCP_TEST_UNSET"):
        server_spec(None, "http://h/mcp", None, None, header_env=["A=MCP_TEST_UNSET"])


def test_examples_read_from_json_or_jsonl_and_checks_by_import_path(tmp_path):
    rows = [{"request": "r", "tool": "t", "arguments": {"a": 1}}]
    (tmp_path / "a.json").write_text(json.dumps(rows))
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps(r) for r in rows * 2) + "\n")
    assert read_examples(tmp_path / "a.json") == rows
    assert read_examples(tmp_path / "b.jsonl") == rows * 2
    (tmp_path / "c.jsonl").write_text('{"request": "r"}\n{oops\n')
    with pytest.raises(typer.BadParameter, match=r"c\.jsonl:2"):
        read_examples(tmp_path / "c.jsonl")
    assert load_check("rlcoach.integrations.mcp.agent:tool_use_check") is tool_use_check
    with pytest.raises(ConfigError, match="not `module:function`"):
        load_check("tool_use_check")
    with pytest.raises(ConfigError, match="cannot be loaded"):
        load_check("rlcoach.integrations.mcp.agent:no_such_check")


async def test_ruler_rewards_blend_the_judge_with_the_check_and_skip_the_example(
    scripted, tmp_path
):
    """The judge is scripted (`scripted` in conftest.py: real HTTP on 127.0.0.1, answers
    from a function), the one seam faked: a real model cannot score on demand."""
    import re

    from rlcoach.integrations.mcp import convert_tools, ruler_rewards

    tools = convert_tools(
        [
            {
                "name": "lookup",
                "description": "Find a thing.",
                "inputSchema": {"type": "object", "properties": {}},
            }
        ]
    )
    example = [
        {"role": "user", "content": "EXAMPLE REQUEST"},
        {"role": "assistant", "content": "EXAMPLE REPLY"},
    ]

    def attempt(answer: str, check: float) -> Trajectory:
        return Trajectory(
            reward=check,
            metadata={"prompt_messages": 3},
            messages=[
                {"role": "system", "content": "You help."},
                *example,
                {"role": "user", "content": "Find it."},
                {"role": "assistant", "content": f"answer {answer}"},
            ],
        )

    def by_answer(request):
        text = request["messages"][1]["content"]
        bodies = dict(re.findall(r'<trajectory id="(\d+)">\n(.*?)\n</trajectory>', text, re.DOTALL))
        return json.dumps(
            {
                k: {"explanation": "", "score": int(re.search(r"answer (\d)", v).group(1)) / 10}
                for k, v in bodies.items()
            }
        )

    scripted.answer = by_answer
    hook = ruler_rewards(scripted.model, tools, weight=0.5, config={"cache_dir": None})
    scored = await hook(TrajectoryGroup([attempt("8", 1.0), attempt("2", 0.0)]))
    assert [t.reward for t in scored.trajectories] == pytest.approx([0.9, 0.1])
    assert [t.metrics["ruler_score"] for t in scored.trajectories] == pytest.approx([0.8, 0.2])
    prompt = json.dumps(scripted.requests[0])
    assert "lookup" in prompt and "Find it." in prompt and "EXAMPLE REQUEST" not in prompt

    scripted.answer = lambda request: "not json"
    failed = await hook(TrajectoryGroup([attempt("8", 1.0), attempt("2", 0.0)]))
    assert [t.reward for t in failed.trajectories] == [1.0, 0.0]  # the check's rewards kept
    assert failed.metadata["ruler_failed"] is True
    with pytest.raises(ValueError, match=r"weight=1\.5"):
        ruler_rewards(scripted.model, tools, weight=1.5)
