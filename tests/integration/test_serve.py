"""`rlcoach serve` as a real subprocess on 127.0.0.1, driven over HTTP and by RemoteBackend.

The server runs the transformers engine here (an in-process engine that starts in
seconds), so keys, names, bodies, idempotency, dropped clients and kill -9 of the server
are tested against the real server, trainer and checkpoints without a vLLM start; the
vLLM-specific faults and the load test are in test_serve_vllm.py. The kill -9 test runs
last: it kills the module's server and starts it again on the same root and port.
"""

import asyncio
import json
import socket
import uuid
from pathlib import Path

import httpx
import openai
import pytest
from serve_process import KEY, ServeProcess

from rlcoach import RemoteBackend, TrainableModel, Trajectory, TrajectoryGroup
from rlcoach.errors import ConfigError, RemoteError, TrainingDataError
from rlcoach.serve.wire import API_PREFIX, SFTRequest, TrainRequest
from rlcoach.trainer.sft import SFTStats
from rlcoach.trajectory.trajectories import ChatRecord

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
QUESTION = [{"role": "user", "content": "Say one word."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    serve = ServeProcess(
        tmp_path_factory.mktemp("serve") / "root", "transformers", "--max-request-mb", "1"
    )
    serve.start()
    yield serve
    serve.stop()


async def scored_groups(model: TrainableModel, size: int = 3) -> list[TrajectoryGroup]:
    """One group of real rollouts through the server, with rewards that differ."""
    client = model.openai_client()
    trajectories = []
    for index in range(size):
        async with model.rollout() as rollout:
            await client.chat.completions.create(
                model=model.served_name, messages=QUESTION, max_tokens=6, temperature=1.0
            )
            rollout.reward = float(index)
        trajectories.append(rollout.trajectory)
    assert all(t.choices for t in trajectories), "the rollouts were not recorded"
    return [TrajectoryGroup(trajectories)]


PROTECTED = [
    ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions"),
    ("POST", f"{API_PREFIX}/models"),
    ("POST", f"{API_PREFIX}/train"),
    ("POST", f"{API_PREFIX}/train_sft"),
    ("POST", f"{API_PREFIX}/rollouts/abc"),
    ("GET", f"{API_PREFIX}/models/p/m/checkpoints"),
    ("DELETE", f"{API_PREFIX}/models/p/m/checkpoints/1"),
    ("GET", f"{API_PREFIX}/metrics"),
    ("GET", f"{API_PREFIX}/status"),
]


@pytest.mark.parametrize("key", [None, "wrong", KEY[:-1], KEY + "x", "Bearer " + KEY, KEY.upper()])
async def test_every_route_but_health_needs_the_key(server, key):
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers) as http:
        assert (await http.get("/health")).status_code == 200
        for method, path in PROTECTED:
            response = await http.request(method, path, content=b"{}")
            assert response.status_code == 401, (method, path, response.text)
            error = response.json()["error"]
            assert error["code"] == "invalid_api_key"
            assert "RLCOACH_API_KEY" in error["message"]
    assert KEY not in server.log.read_text(), "the key was written to the server's log"


async def test_openai_client_with_a_wrong_key_gets_authentication_error(server):
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await client.chat.completions.create(model="x", messages=QUESTION)
    backend = RemoteBackend(server.url, api_key="nope")
    with pytest.raises(ConfigError, match="invalid API key"):
        await TrainableModel("a", "p").register(backend)
    await backend.close()


@pytest.mark.parametrize(
    "project,name",
    [
        ("..", "m"),
        ("p", ".."),
        ("p", "..%2F..%2Fetc"),
        ("%2E%2E", "m"),
        ("p", "a b"),
        ("p", ".hidden"),
    ],
)
async def test_names_that_would_leave_the_root_are_refused(server, project, name):
    async with httpx.AsyncClient(base_url=server.url, headers=server.headers()) as http:
        for method in ("GET", "DELETE"):
            suffix = "/checkpoints" if method == "GET" else "/checkpoints/1"
            response = await http.request(method, f"{API_PREFIX}/models/{project}/{name}{suffix}")
            assert response.status_code in (400, 404), response.text
            assert "error" in response.json()
        body = {
            "name": name.replace("%2F", "/"),
            "project": project.replace("%2E", "."),
            "base_model": "smollm2-135m-instruct",
        }
        response = await http.post(f"{API_PREFIX}/models", json=body)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == "invalid_name" or "safe path" in response.text
    outside = {p.name for p in server.root.parent.iterdir()}
    assert outside <= {"root", *(f.name for f in server.root.parent.glob("serve-*.log"))}


async def test_a_base_model_folder_from_a_client_is_refused(server):
    async with httpx.AsyncClient(base_url=server.url, headers=server.headers()) as http:
        body = {"name": "m", "project": "p", "base_model": "/etc"}
        response = await http.post(f"{API_PREFIX}/models", json=body)
    assert response.status_code == 400
    assert "serves" in response.json()["error"]["message"]


async def test_oversized_and_malformed_bodies_get_openai_shaped_errors(server):
    async with httpx.AsyncClient(base_url=server.url, headers=server.headers()) as http:
        big = json.dumps({"model": "x", "messages": [{"role": "user", "content": "a" * (9 << 20)}]})
        response = await http.post("/v1/chat/completions", content=big)
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "too_large"

        # Over the 1 MiB training limit this server was started with, sent chunked (no length).
        async def chunks():
            for _ in range(20):
                yield b"x" * 65536

        response = await http.post(f"{API_PREFIX}/train", content=chunks())
        assert response.status_code == 413
        for body in (b"{not json", b"[]", b'{"request_id": "abcdefgh"}'):
            response = await http.post(f"{API_PREFIX}/train", content=body)
            assert response.status_code == 400, body
            assert response.json()["error"]["message"].startswith("the body is not a valid")
        response = await http.post("/v1/chat/completions", content=b"{not json")
        assert response.status_code == 400
        assert "not valid JSON" in response.json()["error"]["message"]
        response = await http.get("/v2/nothing")
        assert response.status_code == 404 and "error" in response.json()
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="no-such-model", messages=QUESTION)


async def test_a_client_that_drops_mid_upload_trains_nothing(server):
    request_id = uuid.uuid4().hex
    head = (
        f"POST {API_PREFIX}/train HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
        "Content-Type: application/json\r\nContent-Length: 500000\r\n\r\n"
    )
    partial = '{"request_id": "' + request_id + '", "model": {"name": "drop", "project": "p", '
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(head.encode() + partial.encode())
        await asyncio.sleep(0.5)
    await asyncio.sleep(0.5)
    assert not list(server.root.rglob(f"{request_id}*")), "a half upload was persisted"
    assert not (server.root / "p" / "drop").exists()
    async with httpx.AsyncClient(base_url=server.url, headers=server.headers()) as http:
        assert (await http.get("/health")).status_code == 200
        assert (await http.get(f"{API_PREFIX}/metrics")).status_code == 200


async def test_remote_training_is_idempotent_and_survives_a_dropped_stream(server):
    backend = RemoteBackend(server.url, KEY)
    model = TrainableModel("idem", "serve", config={"learning_rate": 1e-3})
    await model.register(backend)
    assert model.step == 0
    groups = await scored_groups(model)
    request = TrainRequest(
        request_id=uuid.uuid4().hex,
        groups=groups,
        model={"name": "idem", "project": "serve", "base_model": model.base_model},
    )
    body = request.model_dump_json()
    async with httpx.AsyncClient(
        base_url=server.url, headers=server.headers(), timeout=120
    ) as http:
        # Hang up as soon as the step is under way: the step must finish anyway.
        async with http.stream("POST", f"{API_PREFIX}/train", content=body) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if json.loads(line)["event"] == "training":
                    break
        persisted = server.root / "serve" / "idem" / "requests" / f"{request.request_id}.jsonl"
        assert persisted.is_file(), "the upload was acknowledged before it was on disk"
        # The retry attaches to the running step or replays the finished one.
        answers = []
        for _ in range(2):
            response = await http.post(f"{API_PREFIX}/train", content=body)
            result = [json.loads(x) for x in response.text.splitlines()][-1]
            assert result["event"] == "result", response.text
            answers.append(result["result"])
    assert [a["step"] for a in answers] == [1, 1]
    assert answers[1]["replayed"] is True
    listed = await backend.checkpoints(model)
    assert [c.step for c in listed.checkpoints] == [1], "a retried request trained twice"
    assert listed.checkpoints[0].served
    # A second, distinct request trains step 2; the served step cannot be deleted; an older can.
    result = await model.train(await scored_groups(model))
    assert result.step == 2 and model.step == 2 and result.stats.trained
    with pytest.raises(ConfigError, match="latest checkpoint"):
        await backend.delete_checkpoint(model, 2)
    await backend.delete_checkpoint(model, 1)
    assert [c.step for c in (await backend.checkpoints(model)).checkpoints] == [2]
    records = (await backend.metrics(model))["records"]
    assert [r["step"] for r in records if r["event"] == "train"] == [1, 2]
    counters = await backend.metrics()
    assert counters["train_started"] == 2 and counters["train_replayed"] >= 1
    with pytest.raises(TrainingDataError):  # an upload over the server's 1 MiB limit
        big = groups[0].model_copy(deep=True)
        big.trajectories[0].logs = ["x" * (2 << 20)]
        await model.train([big])
    await backend.close()


async def test_sft_and_rl_alternate_on_one_model_through_serve(server):
    backend = RemoteBackend(server.url, KEY)
    model = TrainableModel("mixed", "serve", config={"learning_rate": 1e-3})
    await model.register(backend)
    groups = await scored_groups(model)
    records = [
        ChatRecord(messages=[*QUESTION, {"role": "assistant", "content": word}])
        for word in ("Blue.", "Seven.")
    ]
    # Chat records and a recorded trajectory in one upload, told apart on the server.
    sft = await model.train_sft(
        [*records, groups[0].trajectories[0]], {"epochs": 2, "batch_size": 2}
    )
    assert isinstance(sft.stats, SFTStats) and sft.stats.trained
    assert (sft.step, model.step, sft.stats.examples) == (1, 1, 3)
    rl = await model.train(await scored_groups(model))
    assert rl.step == 2 and rl.stats.trained
    # An SFT request id sent twice trains once; the replay says which trainer ran.
    request = SFTRequest(
        request_id=uuid.uuid4().hex,
        examples=records,
        model={"name": "mixed", "project": "serve", "base_model": model.base_model},
    )
    async with httpx.AsyncClient(
        base_url=server.url, headers=server.headers(), timeout=120
    ) as http:
        answers = []
        for _ in range(2):
            response = await http.post(f"{API_PREFIX}/train_sft", content=request.model_dump_json())
            answers.append([json.loads(x) for x in response.text.splitlines()][-1]["result"])
    assert [(a["step"], a["kind"], a["replayed"]) for a in answers] == [
        (3, "sft", False),
        (3, "sft", True),
    ]
    assert [c.step for c in (await backend.checkpoints(model)).checkpoints] == [1, 2, 3]
    records_seen = (await backend.metrics(model))["records"]
    assert [r["event"] for r in records_seen] == ["sft", "train", "sft"]
    # Nothing to imitate: a clear error, not retried, and no step.
    with pytest.raises(RemoteError, match="assistant") as refused:
        await model.train_sft([ChatRecord(messages=QUESTION)])
    assert not refused.value.retryable
    assert (await backend.checkpoints(model)).latest == 3
    await backend.close()


async def test_art_idioms_and_client_built_trajectories_through_serve(server):
    """`model.log`, `delete_checkpoints`, ART's `backend.train(..., learning_rate=)` and a
    trajectory built from plain messages work through serve as on a LocalBackend."""
    backend = RemoteBackend(server.url, KEY)
    model = TrainableModel("art", "serve", config={"learning_rate": 1e-3})
    await model.register(backend)
    for step in (1, 2):
        groups = await scored_groups(model)
        await model.log(groups, split="val")
        assert (await backend.train(model, groups, learning_rate=2e-3)).step == step
    plain = TrajectoryGroup(
        Trajectory(messages=[*QUESTION, {"role": "assistant", "content": word}], reward=r)
        for word, r in (("Blue.", 1.0), ("Seven.", 0.0))
    )
    result = await model.train([plain])
    assert result.step == 3 == await model.get_step()
    assert result.rendering["client_trajectories"] == 2  # across the wire, as on a LocalBackend
    records = (await backend.metrics(model))["records"]
    assert [r["event"] for r in records] == ["eval", "train", "eval", "train", "train"]
    assert records[0]["val/reward"] == 1.0 and records[0]["val/rollouts"] == 3
    assert records[-1]["tokens_retokenized"] > 0 and records[-1]["client_trajectories"] == 2
    # Steps 0 and 1 scored the same; step 1 is the best checkpoint, step 3 the latest.
    assert await model.delete_checkpoints("val/reward") == [2]
    assert [c.step for c in (await backend.checkpoints(model)).checkpoints] == [1, 3]
    await backend.close()


# Examples run unchanged through this server (each example runs once in the suite:
# see test_examples.py); the others that need a server run on vLLM (test_serve_vllm.py).
THROUGH_SERVE = {
    "ruler_calculator.py": ["--eval-questions", "1", "--questions", "1", "--group-size", "2"]
}


@pytest.mark.parametrize("script", sorted(THROUGH_SERVE))
def test_examples_run_unchanged_against_serve(server, script, tmp_path):
    done = server.run_example(EXAMPLES / script, ["--steps", "1", *THROUGH_SERVE[script]], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 1:" in done.stdout
    project = server.root / "examples"
    assert any(project.rglob("checkpoints/000001/adapter_config.json")) or "skipped" in done.stdout


async def test_kill_9_during_a_step_then_restart_resumes_without_training_twice(server):
    """Runs last: kills the module's server mid-step and starts it again on the same root."""
    backend = RemoteBackend(server.url, KEY, retry_for_s=300)
    model = TrainableModel("crash", "serve", config={"learning_rate": 1e-3})
    await model.register(backend)
    groups = await scored_groups(model, size=4)
    training = asyncio.create_task(model.train(groups))
    requests = server.root / "serve" / "crash" / "requests"
    for _ in range(600):
        if requests.is_dir() and any(requests.glob("*.jsonl")):
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("the upload never reached the disk")
    await asyncio.sleep(0.3)  # inside the step now (the trainer loads, then steps)
    server.kill9()
    assert not training.done()
    checkpoints = server.root / "serve" / "crash" / "checkpoints"
    before = sorted(p.name for p in checkpoints.iterdir()) if checkpoints.is_dir() else []
    await asyncio.to_thread(server.start)
    result = await asyncio.wait_for(training, 300)  # the client's retry, same request id
    assert result.step == 1 and model.step == 1
    done = sorted(p.name for p in checkpoints.iterdir() if not p.name.startswith("."))
    assert done == ["000001"], (before, done)
    # A fresh client registers and resumes from the last complete checkpoint.
    again = TrainableModel("crash", "serve")
    other = RemoteBackend(server.url, KEY)
    await again.register(other)
    assert again.step == 1
    client = again.openai_client()
    reply = await client.chat.completions.create(model="crash", messages=QUESTION, max_tokens=4)
    assert reply.model == "crash@1"
    await backend.close()
    await other.close()
