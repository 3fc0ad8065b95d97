"""`verifiers` environments train and evaluate through rlcoach with no edits.

The environments in tests/integration/verifiers_envs/ are written as verifiers' users
write them (a single-turn, a multi-turn, a tool environment, an MCP environment over a
real `mcp-server-time` subprocess, and one that fails on purpose), and one environment
package published on PyPI (`staros-stardata`'s constraint gym) runs as installed. They
run with the real verifiers package (the pinned 0.3.1, the classic API), their own
rollout loops and rubrics, against the bundled model on one LocalBackend with the
transformers engine (the cheapest that serves the policy endpoint; the vLLM engine serves
the same endpoint and recorder). Nothing is faked.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlcoach import LocalBackend, TrainableModel, load_groups
from rlcoach.integrations.verifiers import (
    EnvironmentLoadError,
    EnvTrainConfig,
    GroupRunner,
    evaluate_environment,
    load,
    rows,
    train_environment,
)

ENVS = Path(__file__).resolve().parent / "verifiers_envs"
RLCOACH = str(Path(sys.executable).with_name("rlcoach"))
SAMPLING = {"max_tokens": 16, "temperature": 1.0}


@pytest.fixture(scope="module")
async def backend(tmp_path_factory):
    async with LocalBackend(
        tmp_path_factory.mktemp("verifiers-runs"), engine={"kind": "transformers"}
    ) as started:
        yield started


async def run_groups(backend, env_name, n_rows, group_size, env_args=None, **sampling):
    env = load(str(ENVS / f"{env_name}.py"), env_args)
    policy = TrainableModel(f"probe-{env_name}", "verifiers-tests")
    await policy.register(backend)
    runner = GroupRunner(env, policy, policy.openai_client(), {**SAMPLING, **sampling})
    return await runner.groups(rows(env, "train", n=n_rows), group_size)


def assert_exact_tokens(trajectory):
    assert trajectory.choices, "no policy call was recorded"
    for choice in trajectory.choices:
        assert choice.token_ids and len(choice.logprobs) == len(choice.token_ids)
        assert choice.prompt_token_ids


async def test_single_turn_environment_trains_and_evaluates(backend):
    config = EnvTrainConfig(
        env=str(ENVS / "single_turn.py"),
        env_args={"n": 4, "eval_n": 2},
        steps=1,
        rows_per_step=2,
        group_size=3,
        eval_rows=2,
        max_tokens=12,
        engine="transformers",
    )
    run = await train_environment(config, backend)
    assert run.before is not None and run.after is not None
    for evaluation in (run.before, run.after):
        assert {"correct", "brief", "distinct"} <= set(evaluation.metrics)
        assert evaluation.rollouts == 2 and evaluation.failed == 0
    assert run.failed_rollouts == 0
    (step,) = run.steps
    assert step.result is not None and step.error is None
    (groups_file,) = (run.run_dir / "trajectories").glob("*.jsonl")
    groups = load_groups(groups_file)
    assert len(groups) == 2 and all(len(g.trajectories) == 3 for g in groups)
    for trajectory in (t for g in groups for t in g.trajectories):
        assert_exact_tokens(trajectory)
        assert len(trajectory.choices) == 1  # one turn
        assert {"correct", "brief", "distinct"} <= set(trajectory.metrics)
    # the group-level function saw the whole group: equal answers share a 0
    metrics = (run.run_dir / "metrics.jsonl").read_text()
    assert "rollout/distinct" in metrics and "rollout/correct" in metrics
    base, trained = await evaluate_environment(config, backend)
    assert trained is not None and trained.model.endswith(f"@{run.trained_steps[-1]}")
    assert base.model.endswith("(base)")


async def test_multi_turn_environment_records_every_turn(backend):
    (group,) = await run_groups(backend, "multi_turn", 1, 3, max_tokens=4)
    assert not group.failures
    for trajectory in group.trajectories:
        assert_exact_tokens(trajectory)
        turns = trajectory.metadata["turns"]
        assert 1 <= turns <= 3
        assert len(trajectory.choices) == turns  # one sequence, every turn's sampled tokens
        assert trajectory.metrics["num_turns"] == turns  # verifiers' own monitor metric
        if turns > 1:  # the environment's replies are in the conversation, as context
            said = [m.get("content") for m in trajectory.messages if m["role"] == "user"]
            assert any("Guess again" in (s or "") for s in said)


async def test_tool_environment_offers_its_tools(backend):
    (group,) = await run_groups(backend, "tool_use", 1, 2, max_tokens=40)
    assert not group.failures
    for trajectory in group.trajectories:
        assert_exact_tokens(trajectory)
        assert [t["function"]["name"] for t in trajectory.tools or []] == ["add"]
        assert "total_tool_calls" in trajectory.metrics


async def test_mcp_environment_runs_with_its_server(backend):
    env = load(str(ENVS / "mcp_time.py"))
    reply = await env.call_tool("get_current_time", {"timezone": "Asia/Tokyo"}, "call-1")
    assert "+09:00" in reply.content  # the environment's tool reaches the real server
    (group,) = await run_groups(backend, "mcp_time", 1, 2, max_tokens=48)
    assert not group.failures
    for trajectory in group.trajectories:
        assert_exact_tokens(trajectory)
        assert [t["function"]["name"] for t in trajectory.tools or []] == ["get_current_time"]
        for message in trajectory.messages:  # a call the model made was answered by the server
            if message["role"] == "tool":
                assert "datetime" in message["content"] or "Error" in message["content"]


async def test_a_published_environment_package_trains(backend, tmp_path):
    """`staros-stardata` from PyPI: its constraint gym is a `vf.SingleTurnEnv` whose
    deterministic prosody reward scores poems; loaded by module name, as installed."""
    config = EnvTrainConfig(
        env="stardata.envs.constraint_gym",
        env_args={"forms": ["haiku"], "topics_per_form": 2},
        name="stardata-haiku",
        steps=1,
        rows_per_step=1,
        group_size=2,
        eval_rows=1,
        max_tokens=24,
        engine="transformers",
    )
    run = await train_environment(config, backend)
    assert run.failed_rollouts == 0 and run.steps[0].error is None
    assert run.after is not None and "prosody_reward" in run.after.metrics
    assert 0.0 <= run.after.metrics["prosody_reward"] <= 1.0


async def test_a_rollout_that_raises_is_recorded_with_the_environment_traceback(backend):
    groups = await run_groups(backend, "broken", 3, 2, env_args={"fail": "rollout"})
    failed = [f for g in groups for f in g.failures]
    assert len(failed) == 2  # the "boom" row's two attempts; the other rows go on
    assert all("simulator crashed" in f.message for f in failed)
    assert all("broken.py" in f.traceback and "env_response" in f.traceback for f in failed)
    assert sum(len(g.trajectories) for g in groups) == 4


async def test_a_nan_reward_is_a_failed_rollout_naming_the_function(backend):
    groups = await run_groups(backend, "broken", 1, 2, env_args={"fail": "nan"})
    (group,) = groups
    assert not group.trajectories
    assert len(group.failures) == 2
    assert all("reward" in f.message and "NaN" in f.message for f in group.failures)


def test_an_environment_that_fails_to_load_shows_its_traceback():
    with pytest.raises(EnvironmentLoadError, match="data file is missing") as caught:
        load(str(ENVS / "broken.py"), {"fail": "load"})
    assert isinstance(caught.value.__cause__, FileNotFoundError)
    done = subprocess.run(
        [RLCOACH, "env", "train", str(ENVS / "broken.py"), "--env-args", '{"fail": "load"}'],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "data file is missing" in done.stderr
    assert "broken.py" in done.stderr and "load_environment" in done.stderr  # its traceback
    done = subprocess.run(
        [RLCOACH, "env", "train", str(ENVS / "single_turn.py"), "--env-args", "[1]"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "JSON object" in done.stderr


def test_env_eval_prints_the_environments_metrics(tmp_path):
    done = subprocess.run(
        [
            RLCOACH,
            "env",
            "eval",
            str(ENVS / "single_turn.py"),
            "--env-args",
            '{"eval_n": 2}',
            "--eval-rows",
            "2",
            "--max-tokens",
            "8",
            "--engine",
            "transformers",
            "--root",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "base" in done.stdout and "correct=" in done.stdout and "distinct=" in done.stdout
    assert "no trained steps yet" in done.stdout
