"""The MCP agent loop with the real policy (vLLM serving the bundled model) against real
servers: `mcp-server-time` from PyPI and a server with faults on purpose, both over stdio.

The 135M model almost never calls these tools on its own (0 of 32 samples in our probes,
with or without a worked example), so the tests that need a particular call constrain
the real engine's sampling to that call with vLLM structured outputs (`extra_body`).
Everything else is real: the engine samples the call's tokens, its tool parser reads
them, the gateway records them, the server runs the call and the trainer learns from it.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlcoach import TrainableModel, gather_trajectory_groups, load_groups
from rlcoach.autorl import load_records
from rlcoach.integrations.mcp import ServerSpec, connect, convert_tools
from rlcoach.integrations.mcp.agent import build_demonstration, run_agent
from rlcoach.integrations.mcp.train import MCPTrainConfig, train_on_server

pytestmark = pytest.mark.vllm

TIME = ServerSpec(command=[str(Path(sys.executable).with_name("mcp-server-time"))])
FAULTY = ServerSpec(command=[sys.executable, str(Path(__file__).with_name("mcp_faulty_server.py"))])
INVENTORY = ServerSpec(command=[sys.executable, "-m", "rlcoach.integrations.mcp.inventory"])


def forced(name: str, arguments: dict, **config) -> dict:
    """An agent config whose replies are constrained to this one tool call."""
    call = f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"
    return {
        "max_turns": 1,
        # The choice constraint alone decides the reply: no call grammar beside it.
        "first_tool_choice": "auto",
        "extra_body": {"structured_outputs": {"choice": [call]}},
        **config,
    }


@pytest.fixture(scope="module")
async def agent(vllm_backend):
    model = TrainableModel("mcp-agent", "integration", config={"learning_rate": 1e-3})
    await model.register(vllm_backend)
    return model


async def _tools(spec: ServerSpec):
    async with connect(spec) as server:
        return convert_tools(await server.list_tools())


async def test_time_server_rollouts_call_real_tools_and_train_a_step(agent):
    tools = await _tools(TIME)
    client = agent.openai_client()
    good = forced("get_current_time", {"timezone": "Asia/Tokyo"})
    bad = forced("get_current_time", {"timezone": "Mars/Olympus_Mons"})
    groups = await gather_trajectory_groups(
        [
            [
                run_agent(agent, client, TIME, "What time is it in Tokyo?", tools, config=c)
                for c in (good, bad)
            ]
        ],
        progress=False,
    )
    [group] = groups
    assert not group.failures
    ok, failed = group.trajectories
    assert ok.metrics["tool_ok"] == 1 and ok.metrics["tool_calls"] == 1
    call = ok.messages[-2]["tool_calls"][0]["function"]
    assert call["name"] == "get_current_time" and json.loads(call["arguments"]) == {
        "timezone": "Asia/Tokyo"
    }
    result = ok.messages[-1]
    assert result["role"] == "tool" and '"timezone": "Asia/Tokyo"' in result["content"]
    assert "datetime" in result["content"]  # the server's real answer
    assert ok.choices and ok.choices[0].token_ids and ok.tools == tools.tools
    assert failed.metrics["tool_errors"] == 1 and failed.metrics["tool_ok"] == 0
    assert "Mars/Olympus_Mons" in failed.messages[-1]["content"]
    assert failed.messages[-1]["is_error"] is True and "is_error" not in result  # a field
    assert any("tool_error get_current_time" in line for line in failed.logs)
    assert ok.reward > failed.reward  # a successful call beats a failed one
    step = await agent.train(groups)
    assert step.stats.trained and agent.served_name.endswith("@1")


async def test_the_free_policy_runs_to_a_final_answer_or_the_turn_limit(agent):
    tools = await _tools(TIME)
    async with connect(TIME) as server:
        example = await build_demonstration(server, tools)
    assert example[1]["tool_calls"][0]["function"]["name"] in tools.names
    assert example[2]["role"] == "tool" and "datetime" in example[2]["content"]
    trajectory = await run_agent(
        agent,
        agent.openai_client(),
        TIME,
        "What time is it in Paris?",
        tools,
        demonstration=example,
        config={"max_turns": 2, "max_tokens": 48},
    )
    m = trajectory.metrics
    assert 1 <= m["turns"] <= 2 and (m["finished"] == 1 or m["turns"] == 2)
    assert trajectory.metadata["prompt_messages"] == 1 + len(example)
    assert trajectory.messages[: 1 + len(example)][1:] == example
    assert sum(len(h.choices) for h in trajectory.histories()) == m["turns"]


async def test_faults_are_answered_counted_or_fail_only_their_rollout(agent):
    tools = await _tools(FAULTY)
    client = agent.openai_client()
    configs = {
        # The constraint admits any tokenization of the 300 x's (one token each, at worst).
        "echo": forced("echo", {"text": "x" * 300}, result_chars=80, max_tokens=400),
        "tool error": forced("fail", {"reason": "testing"}),
        "bad arguments": forced("fail", {"why": 1}),
        "hang": forced("hang", {}, call_timeout_s=2),
        "rollout timeout": forced("hang", {}, call_timeout_s=120, rollout_timeout_s=8),
        "crash": forced("crash", {}),
    }
    [group] = await gather_trajectory_groups(
        [
            [
                run_agent(agent, client, FAULTY, "Do the thing.", tools, config=c)
                for c in configs.values()
            ]
        ],
        progress=False,
        max_failure_fraction=1.0,
    )
    echo, tool_error, rejected = group.trajectories
    assert "more characters cut by rlcoach; result_chars=80" in echo.messages[-1]["content"]
    assert len(echo.messages[-1]["content"]) <= 80 and echo.metrics["tool_ok"] == 1
    assert tool_error.metrics["tool_errors"] == 1
    assert "failed on purpose: testing" in tool_error.messages[-1]["content"]
    assert rejected.metrics["invalid_calls"] == 1  # never reached the server
    assert "do not match its schema" in rejected.messages[-1]["content"]
    flags = [t.messages[-1].get("is_error", False) for t in (echo, tool_error, rejected)]
    assert flags == [False, True, True]
    failures = {f.type: f.message for f in group.failures}
    assert "call_timeout_s=2" in failures["ToolTimeoutError"]
    assert "rollout_timeout_s=8" in failures["RolloutTimeoutError"]
    assert "crashing on purpose" in failures["MCPServerError"]  # the server's stderr
    step = await agent.train([group])  # training goes on with what succeeded
    assert step.stats.trained


async def test_train_on_server_writes_a_report(agent, vllm_backend, tmp_path):
    """The whole job on our inventory server with its defaults: exploration of the safe
    tools (update_stock and create_order are not called), grounded scenarios, the
    grounded reward, an SFT warm-up (step 1) on the worked examples, then the RL step
    (step 2). The warm-up is asked for: with its first call forced (and room for the
    call's values), the base model already answers this server's held-out tasks."""
    config = MCPTrainConfig(
        server=INVENTORY,
        name="inventory-job",
        steps=1,
        scenarios=8,
        group_size=2,
        scenarios_per_step=1,
        eval_fraction=0.34,
        warmup_examples=2,
        warmup_epochs=1,
        agent={"max_turns": 2, "max_tokens": 48},
        progress=False,
    )
    report = await train_on_server(config, backend=vllm_backend)
    folder = Path(report["run_dir"])
    saved = json.loads((folder / "report.json").read_text())
    assert saved == report and saved["tools"] == ["search_items", "get_item", "list_orders"]
    assert not saved["safety"]["create_order"]["allowed"]
    assert "its name says 'update'" in saved["safety"]["update_stock"]["rule"]
    assert saved["exploration"]["calls_that_worked"] >= 2 and saved["reward"] == "grounded_check"
    assert (folder / "exploration.json").is_file() and (folder / "sandbox" / "home").is_dir()
    assert saved["scenarios"]["train"] >= 1 and saved["scenarios"]["eval"] >= 1
    train = load_records(folder / "scenarios" / "train.jsonl")
    held_out = load_records(folder / "scenarios" / "eval.jsonl")
    assert not {r.metadata["call"] for r in train} & {r.metadata["call"] for r in held_out}
    assert all(r.metadata["facts"] and r.metadata["answer_key"] for r in train)
    for when in ("before", "warmup", "after"):  # the held-out rollouts, to read them back
        groups = load_groups(folder / f"eval_{when}.jsonl")
        assert len(groups) == saved["scenarios"]["eval"]
    [step] = saved["steps"]
    # a group whose attempts all scored the same is sampled again on another scenario once
    assert step["groups_sampled"] in (1, 2) and step["rollouts"] == 2 * step["groups_sampled"]
    assert step["served"].startswith("inventory-job@")
    for key in ("success", "reward", "tool_error_rate"):
        assert 0.0 <= saved["eval_before"][key] <= 1.0 and 0.0 <= saved["eval_after"][key] <= 1
    markdown = (folder / "report.md").read_text()
    assert "| step | reward |" in markdown and "## Exploration" in markdown
    assert saved["warmup"]["examples"] == 2 and step["step"] == 2
    assert saved["lora"] is not None  # the warm-up's adapter at least
    labels = [p["label"] for p in saved["held_out_curve"]]
    assert labels == (["before", "SFT", "RL 1"] if step["trained"] else ["before", "SFT"])
    assert "| after the SFT warm-up |" in markdown


def test_autorl_cli_writes_scenarios_for_an_mcp_server(policy, tmp_path):
    """`rlcoach autorl generate --mcp`: AutoRL reaches the server through the plugin."""
    server = f"{sys.executable} -m rlcoach.integrations.mcp.inventory"
    command = [
        str(Path(sys.executable).with_name("rlcoach")),
        "autorl",
        "generate",
        "--mcp",
        server,
        "--n",
        "4",
        "--out",
        str(tmp_path / "data"),
        "--generator-url",
        policy.api_base,
        "--batch-size",
        "4",
        "--no-system-prompt",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((tmp_path / "data" / "dataset.json").read_text())
    assert manifest["mcp"] == server and manifest["tools"][:2] == ["search_items", "get_item"]
    records = [
        *load_records(tmp_path / "data" / "train.jsonl"),
        *load_records(tmp_path / "data" / "eval.jsonl"),
    ]
    assert len(records) == 4 and {r.metadata["kind"] for r in records} == {"scenario"}
    assert "5 tools from" in done.stderr
