"""Langfuse: the real SDK (5.2) exporting our traces and scores to a receiver of ours.

Why the receiver is ours: Langfuse's server needs Docker (Postgres, ClickHouse, Redis,
S3), which this machine does not have. `bench/langfuse_receiver.py` stands in for it on
127.0.0.1 — the one seam faked — accepting what the SDK sends (OTLP/HTTP protobuf spans
on /api/public/otel/v1/traces, JSON scores on /api/public/scores) and decoding the spans
with opentelemetry-proto. Our sink and its thread, the SDK, its OTLP exporter and batching
all run for real; RULER scores come from `score_group` with a scripted judge (a real HTTP
server, see conftest.py). The last test trains `examples/basic_loop.py` on the real vLLM
engine with LANGFUSE_* pointing at the receiver.
"""

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from langfuse_receiver import LangfuseReceiver

from rlcoach import History, RolloutFailure, SampledChoice, Trajectory, TrajectoryGroup, load_groups
from rlcoach.integrations.langfuse import trace_id
from rlcoach.observe.sinks import SinkConfig, open_sinks, rollout_metrics, run_info
from rlcoach.ruler import RulerConfig, score_group
from rlcoach.trajectory.trajectories import tool_message

ROOT = Path(__file__).resolve().parents[2]
ADD = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
BAD = {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a": "x"}'}}


@pytest.fixture
def receiver():
    server = LangfuseReceiver()
    yield server
    server.close()


@pytest.fixture
def langfuse_env(receiver, monkeypatch):
    """The standard variables, a fresh key per test (the SDK keeps one client per key)."""
    key = f"pk-lf-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", key)
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", "sk-lf-test")
    monkeypatch.setenv("LANGFUSE_HOST", receiver.url)
    return key


def _choice(message, start, tokens=3):
    return SampledChoice(
        message=message,
        prompt_token_ids=list(range(40)),
        token_ids=list(range(tokens)),
        logprobs=[-0.5] * tokens,
        policy="agent@2",
        finish_reason="stop",
        started_at=start,
        latency_s=0.25,
    )


def _agent(answer: str) -> Trajectory:
    """Two tool calls (one fails) then an answer, plus a sub-agent history."""
    ask = {"role": "assistant", "content": None, "tool_calls": [ADD, BAD]}
    final = {"role": "assistant", "content": f"answer {answer}"}
    messages = [
        {"role": "system", "content": "You add numbers."},
        {"role": "user", "content": "What is 2 + 3?"},
        ask,
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        tool_message("c2", "a must be an integer", error=True),
        final,
    ]
    summary = {"role": "assistant", "content": "sums"}
    return Trajectory(
        messages=messages,
        choices=[_choice(ask, 1000.0), _choice(final, 1001.0, 5)],
        additional_histories=[
            History(
                messages=[{"role": "user", "content": "summarise"}, summary],
                choices=[_choice(summary, 1002.0)],
            )
        ],
        reward=float(answer == "5"),
        metrics={"success": float(answer == "5")},
        metadata={"task": "add-2-3", "split": "train"},
        started_at=999.5,
        finished_at=1003.0,
    )


def _judge(request: dict) -> str:
    """Scores by the number each attempt answered: 'answer 5' is right."""
    text = request["messages"][1]["content"]
    bodies = dict(re.findall(r'<trajectory id="(\d+)">\n(.*?)\n</trajectory>', text, re.DOTALL))
    return json.dumps(
        {
            label: {
                "score": 0.9 if "answer 5" in body else 0.1,
                "explanation": "right sum" if "answer 5" in body else "wrong sum",
            }
            for label, body in bodies.items()
        }
    )


async def test_rollouts_become_trace_trees_with_scores(receiver, langfuse_env, scripted, tmp_path):
    scripted.answer = _judge
    group = await score_group(
        TrajectoryGroup([_agent("5"), _agent("6")]),
        scripted.model,
        config=RulerConfig(cache_dir=tmp_path / "cache"),
    )
    group.failures.append(RolloutFailure(type="ToolTimeoutError", message="add was too slow"))
    sinks = open_sinks(run_info(tmp_path, "proj", "agent", "base", {}), SinkConfig())
    assert sinks.names == ["langfuse"]  # turned on by the environment alone
    sinks.log_trajectories(3, [group])
    record = sinks.log_metrics(
        3,
        {
            "event": "train",
            "loss": 0.12,
            "kl": 0.01,
            "grad_norm": 0.5,
            "step_seconds": 12.0,
            "publish_seconds": 0.08,
            "mismatch_abs_mean": 0.03,
            "mismatch_kl_k3": 0.001,
            **rollout_metrics([group]),
        },
    )
    sinks.close()  # flushes the SDK
    assert record["sink_errors/langfuse"] == 0 and sinks.counters()["sink_errors/langfuse"] == 0

    assert all(h["authorization"].startswith("Basic ") for h in receiver.headers)
    assert receiver.unknown == []
    traces = receiver.traces()
    assert len(traces) == 4  # two rollouts, one failed rollout, one step
    right, wrong = group.trajectories
    for trajectory in (right, wrong):
        spans = traces[trace_id(trajectory.id)]
        by_id = {s.span_id: s for s in spans}
        (root,) = [s for s in spans if s.parent_id is None]
        assert root.name == "rollout" and root.start_ns == 999_500_000_000
        assert root.attributes["langfuse.trace.name"] == "proj/agent/3"
        assert root.attributes["session.id"] == "proj/agent"
        assert {"proj", "agent", "step:3"} <= set(root.attributes["langfuse.trace.tags"])
        assert json.loads(root.attributes["langfuse.trace.metadata.task"]) == "add-2-3"
        generations = [s for s in spans if s.type == "generation"]
        assert len(generations) == 3
        main = [g for g in generations if g.parent_id == root.span_id]
        first, last = sorted(main, key=lambda g: g.start_ns)
        assert first.attr("model.name") == "agent@2"
        assert first.attr("usage_details") == {"input": 40, "output": 3, "total": 43}
        assert [m["role"] for m in first.attr("input")] == ["system", "user"]
        assert last.attr("output")["content"].startswith("answer")
        assert (first.start_ns, first.end_ns) == (1_000_000_000_000, 1_000_250_000_000)
        (sub,) = [g for g in generations if g not in main]
        assert (
            by_id[sub.parent_id].name == "history-1"
            and by_id[sub.parent_id].parent_id == root.span_id
        )
        tools = sorted(
            (s for s in spans if s.type == "tool"),
            key=lambda s: s.attr("input")["a"] if isinstance(s.attr("input")["a"], int) else 99,
        )
        assert [t.name for t in tools] == ["add", "add"]
        assert tools[0].attr("input") == {"a": 2, "b": 3}
        assert tools[0].attributes["langfuse.observation.output"] == "5"
        assert tools[1].attr("level") == "ERROR" and "integer" in tools[1].attr("output")
        assert all(t.parent_id == root.span_id for t in tools)
        scores = receiver.scores_of(trace_id(trajectory.id))
        assert scores["reward"]["value"] == trajectory.reward
        assert scores["ruler"]["value"] == trajectory.metrics["ruler_score"]
        assert scores["ruler"]["comment"] == ("right sum" if trajectory is right else "wrong sum")
        assert scores["original_reward"]["value"] in (0.0, 1.0)
        assert scores["success"]["dataType"] == "NUMERIC"
    assert right.reward == 0.9 and wrong.reward == 0.1  # RULER's scores became the rewards

    failed = [spans for spans in traces.values() if spans[0].attr("level") == "ERROR"]
    assert len(failed) == 1 and "ToolTimeoutError" in failed[0][0].attr("status_message")
    (step,) = [
        spans
        for spans in traces.values()
        if spans[0].attributes.get("langfuse.trace.name") == "proj/agent/3/train"
    ]
    assert step[0].attr("output")["loss"] == 0.12
    step_scores = receiver.scores_of(step[0].trace_id)
    assert step_scores["reward_mean"]["value"] == 0.5 and step_scores["loss"]["value"] == 0.12
    assert {"reward_std", "kl", "grad_norm", "step_seconds", "publish_seconds"} <= set(step_scores)
    assert step_scores["mismatch_abs_mean"]["value"] == 0.03
    assert step_scores["mismatch_kl_k3"]["value"] == 0.001


def test_langfuse_stays_off_without_its_keys(tmp_path, monkeypatch):
    for name in ("LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY"):
        monkeypatch.delenv(name, raising=False)
    sinks = open_sinks(run_info(tmp_path, "p", "m", "b", {}), SinkConfig())
    assert sinks.names == []
    sinks.close()
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", "pk")
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", "sk")
    monkeypatch.setenv("LANGFUSE_TRACING_ENABLED", "false")  # the SDK's own off switch
    assert open_sinks(run_info(tmp_path, "p", "m", "b", {}), SinkConfig()).names == []
    monkeypatch.delenv("LANGFUSE_TRACING_ENABLED")
    off = open_sinks(run_info(tmp_path, "p", "m", "b", {}), SinkConfig(plugins={"langfuse": False}))
    assert off.names == []


def test_an_unreachable_langfuse_is_counted_not_fatal(tmp_path, monkeypatch, receiver):
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", f"pk-lf-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", "sk")
    sinks = open_sinks(
        run_info(tmp_path, "p", "m", "b", {}),
        SinkConfig(plugins={"langfuse": {"host": "http://127.0.0.1:9", "timeout_s": 1}}),
    )
    sinks.log_trajectories(1, [TrajectoryGroup([_agent("5")])])
    sinks.log_metrics(1, {"event": "train"})
    sinks.close()  # the SDK logs its export failures; the step never saw them
    assert (tmp_path / "p" / "m" / "metrics.jsonl").exists()


@pytest.mark.vllm
def test_training_run_sends_a_trace_tree_for_every_rollout(receiver, tmp_path):
    """The issue's 'done when': examples/basic_loop.py on vLLM with LANGFUSE_* set."""
    env = {
        **os.environ,
        "LANGFUSE_PUBLIC_KEY": "pk-lf-example",
        "LANGFUSE_SECRET_KEY": "sk",
        "LANGFUSE_HOST": receiver.url,
    }
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "basic_loop.py"),
            "--steps",
            "2",
            "--engine",
            "vllm",
            "--root",
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "examples" / "basic"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(r["sink_errors/langfuse"] == 0 for r in records)
    traces = receiver.traces()
    trajectories = [
        t
        for path in sorted((run / "trajectories").glob("*.jsonl"))
        for g in load_groups(path)
        for t in g.trajectories
    ]
    assert len(trajectories) == 16
    for trajectory in trajectories:
        spans = traces[trace_id(trajectory.id)]
        (root,) = [s for s in spans if s.parent_id is None]
        (generation,) = [s for s in spans if s.type == "generation"]
        assert generation.parent_id == root.span_id
        assert re.fullmatch(r"basic@\d+", generation.attr("model.name"))
        assert generation.attr("usage_details")["output"] == len(trajectory.choices[0].token_ids)
        assert generation.end_ns > generation.start_ns  # real latency from the gateway
        assert receiver.scores_of(root.trace_id)["reward"]["value"] == pytest.approx(
            trajectory.reward
        )
    steps = [s for s in receiver.spans if s.name == "train-step"]
    assert len(steps) == len(records)
    # the sampler/trainer mismatch of every trained step, on disk and in Langfuse
    trained = [r for r in records if r.get("trained")]
    assert trained
    for record in trained:
        assert 0.0 <= record["mismatch_abs_mean"] <= record["mismatch_abs_max"]
        assert record["mismatch_kl_k3"] >= 0.0 and 0.0 <= record["mismatch_beyond_fraction"] <= 1
        assert abs(record["mismatch_abs_mean"]) < 0.2, record  # the sampler and trainer agree
    scored = [receiver.scores_of(s.trace_id) for s in steps]
    assert sum("mismatch_abs_mean" in scores for scores in scored) == len(trained)
