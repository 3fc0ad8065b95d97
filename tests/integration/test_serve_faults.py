"""`rlcoach serve` under faults and hostile input, on real processes: the fault matrix.

The server is a real `rlcoach serve` subprocess on 127.0.0.1, serving HTTPS with a
certificate made here (openssl), over a tiny random-weight model (tests/conftest.py) on
the transformers engine in a process of its own (`--engine transformers-process`): it
speaks vLLM's API on a private socket and is supervised exactly like vLLM, so killing
it, its restart and the reload of its adapters are real, at seconds per engine start
instead of a minute. Nothing is faked. Every test records what the user saw and what was
on disk afterwards in the fault matrix, which must agree with docs/faults.md
(tests/fault_matrix.py). The SIGTERM test restarts the server and runs last.
"""

import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import openai
import pytest
from serve_process import KEY, ServeProcess

from rlcoach import RemoteBackend, SampledChoice, TrainableModel, Trajectory, TrajectoryGroup
from rlcoach.config import EngineConfig
from rlcoach.errors import ConfigError, EngineStartError, RemoteError, TrainingDataError
from rlcoach.paths import UNCOMMITTED
from rlcoach.runtime.failpoints import FOLDER_VARIABLE, arm
from rlcoach.runtime.processes import free_port
from rlcoach.serve.wire import API_PREFIX, TrainRequest
from rlcoach.trajectory.trajectories import ChatRecord

QUESTION = [{"role": "user", "content": "Say one word."}]


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1 (None where openssl is missing)."""
    if shutil.which("openssl") is None:
        return None
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_path, certificate):
    extra = [
        "--base-model",
        str(tiny_model_path),
        "--max-request-mb",
        "2",
        "--max-model-len",
        "512",
        "--upload-timeout-s",
        "3",
    ]
    env, scheme = {}, "http"
    if certificate is not None:
        extra += ["--ssl-certfile", str(certificate[0]), "--ssl-keyfile", str(certificate[1])]
        env, scheme = {"SSL_CERT_FILE": str(certificate[0])}, "https"
    folder = tmp_path_factory.mktemp("faults")
    # Failpoints (core/runtime/failpoints.py) of the server and its engine are armed by a file here.
    server_env = {**env, FOLDER_VARIABLE: str(folder / "failpoints")}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():  # httpx (and so RemoteBackend) trusts it
            patch.setenv(name, value)
        serve = ServeProcess(
            folder / "root", "transformers-process", *extra, scheme=scheme, env=server_env
        )
        serve.base_model = str(tiny_model_path)
        serve.failpoints = folder / "failpoints"
        serve.start()
        yield serve
        serve.stop()


def tiny(server: ServeProcess, name: str, **config: object) -> TrainableModel:
    """A model of this server's base model (the tiny one)."""
    return TrainableModel(name, "faults", base_model=server.base_model, config=config)


def client(server: ServeProcess, **headers: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=server.url, headers={**server.headers(), **headers}, timeout=120
    )


def raw_request(server: ServeProcess, data: bytes, wait_s: float = 0.0) -> bytes:
    """Send bytes as they are (a bad header, a body that trickles) and read the answer."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    if server.url.startswith("https"):
        sock = ssl.create_default_context().wrap_socket(sock, server_hostname="127.0.0.1")
    with sock:
        sock.sendall(data)
        time.sleep(wait_s)
        chunks = []
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                chunks.append(chunk)
    return b"".join(chunks)


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0


async def scored_groups(model: TrainableModel, size: int = 3) -> list[TrajectoryGroup]:
    client = model.openai_client()
    trajectories = []
    for index in range(size):
        async with model.rollout() as rollout:
            await client.chat.completions.create(
                model=model.served_name, messages=QUESTION, max_tokens=4, temperature=1.0
            )
            rollout.reward = float(index)
        trajectories.append(rollout.trajectory)
    return [TrajectoryGroup(trajectories)]


def checkpoints(server: ServeProcess, project: str, name: str) -> list[str]:
    folder = server.root / project / name / "checkpoints"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def on_disk(server: ServeProcess, project: str, name: str) -> str:
    """What a run folder holds, in words the matrix can compare."""
    run = server.root / project / name
    steps = [str(int(n)) for n in checkpoints(server, project, name) if n.isdigit()]
    other = [n for n in checkpoints(server, project, name) if not n.isdigit()]
    requests = run / "requests"
    uploads = len(list(requests.glob("*.jsonl"))) if requests.is_dir() else 0
    return (
        f"checkpoints [{', '.join(steps)}]"
        + (f" and stray {other}" if other else "")
        + f"; {uploads} upload file(s)"
    )


async def test_hostile_input_to_every_route_gets_a_4xx_and_the_server_stays_up(
    server, fault_matrix
):
    backend = RemoteBackend(server.url, KEY)
    model = tiny(server, "hostile")
    await model.register(backend)
    run = server.root / "faults" / "torn"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1, "event": "train"}\n{"step": 2, "ev')
    deep = b"[" * 100_000 + b"]" * 100_000
    chat = f"{API_PREFIX}"
    cases: list[tuple[str, str, bytes]] = [
        ("POST", "/v1/chat/completions", deep),
        (
            "POST",
            "/v1/chat/completions",
            json.dumps({"model": "hostile@²", "messages": QUESTION}).encode(),
        ),
        (
            "POST",
            "/v1/chat/completions",
            json.dumps({"model": "hostile@" + "9" * 5000, "messages": QUESTION}).encode(),
        ),
        (
            "POST",
            "/v1/chat/completions",
            json.dumps({"model": "hostile", "messages": QUESTION, "n": 10**6}).encode(),
        ),
        (
            "POST",
            "/v1/chat/completions",
            json.dumps({"model": "hostile", "messages": QUESTION, "top_logprobs": 10**6}).encode(),
        ),
        (
            "POST",
            "/v1/chat/completions",
            json.dumps({"model": "hostile", "messages": QUESTION, "max_tokens": "many"}).encode(),
        ),
        (
            "POST",
            "/v1/chat/completions",
            b'{"model": "hostile", "messages": [{"role": "user", "content": "x"}], '
            b'"temperature": NaN}',
        ),
        (
            "POST",
            "/v1/chat/completions",
            json.dumps({"model": "hostile", "messages": QUESTION, "stop": 5}).encode(),
        ),
        ("POST", f"{chat}/models", deep),
        (
            "POST",
            f"{chat}/models",
            json.dumps({"name": "calc\n", "project": "p", "base_model": "x"}).encode(),
        ),
        ("POST", f"{chat}/train", deep),
        ("POST", f"{chat}/train_sft", deep),
        ("DELETE", f"{chat}/models/faults/hostile/checkpoints/%C2%B2", b""),
        ("DELETE", f"{chat}/models/faults/hostile/checkpoints/" + "9" * 5000, b""),
        ("DELETE", f"{chat}/models/faults/hostile/checkpoints/0", b""),
        ("GET", f"{chat}/models/faults/calc%0A/checkpoints", b""),
    ]
    statuses = []
    async with client(server) as http:
        for method, path, body in cases:
            response = await http.request(method, path, content=body)
            assert 400 <= response.status_code < 500, (path, body[:80], response.text[:300])
            assert response.json()["error"]["message"], response.text
            statuses.append(response.status_code)
        torn = await http.get(f"{chat}/models/faults/torn/metrics")
        assert torn.status_code == 200 and torn.json()["unreadable_lines"] == 1
        assert [r["step"] for r in torn.json()["records"]] == [1]
        assert (await http.get("/health")).status_code == 200
    head = (
        f"POST {chat}/train HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        f"Authorization: Bearer {KEY}\r\n"
    )
    answer = await asyncio.to_thread(
        raw_request, server, (head + "Content-Length: " + "9" * 5000 + "\r\n\r\n").encode()
    )
    statuses.append(status_of(answer))
    assert 400 <= status_of(answer) < 500, answer[:300]
    assert server.process.poll() is None
    fault_matrix.record(
        "hostile input on every route: JSON nested 100,000 deep, `name@²`, 5000-digit steps "
        "and Content-Length, n=10^6, top_logprobs=10^6, NaN temperature, `calc\\n` as a "
        "name, a torn last line in metrics.jsonl",
        f"HTTP {', '.join(str(s) for s in sorted(set(statuses)))} with a message naming the "
        "value and the fix; the torn line is skipped and counted; the server stays up",
        "nothing written",
    )
    await backend.close()


async def test_web_pages_and_rebinding_are_refused_before_the_key(server, fault_matrix):
    async with client(server, origin="http://evil.example") as http:
        response = await http.post(
            f"{API_PREFIX}/train", content=b"{}", headers={"content-type": "text/plain"}
        )
    assert response.status_code == 403, response.text
    assert response.json()["error"]["code"] == "origin_not_allowed"
    async with client(server, host=f"rebound.example:{server.port}") as http:
        rebound = await http.get(f"{API_PREFIX}/status")
    assert rebound.status_code == 403
    assert rebound.json()["error"]["code"] == "host_not_allowed"
    fault_matrix.record(
        "a web page POSTs text/plain to the server through its reader's browser (an Origin "
        "header), or reaches it by DNS rebinding (a foreign Host on a loopback bind)",
        f"HTTP {response.status_code} `origin_not_allowed` / {rebound.status_code} "
        "`host_not_allowed`, before the key is even looked at",
        "nothing written",
    )


def test_a_keyless_bind_beyond_loopback_is_refused(tmp_path, fault_matrix):
    env = {k: v for k, v in os.environ.items() if k != "RLCOACH_API_KEY"}
    done = subprocess.run(
        [
            *(sys.executable, "-m", "rlcoach.cli", "serve", "--host", "0.0.0.0"),
            *("--port", str(free_port()), "--root", str(tmp_path / "root")),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 2, done.stderr
    assert "without an API key" in done.stderr and "--insecure" in done.stderr
    fault_matrix.record(
        "`rlcoach serve --host 0.0.0.0` with no $RLCOACH_API_KEY",
        f"exit code {done.returncode} at once: refusing to serve without an API key; fix: "
        "set the key, bind 127.0.0.1, or pass --insecure",
        "nothing written" if not (tmp_path / "root").exists() else "a root folder",
    )


def _trajectory(prompt: list[int], sampled: list[int], reward: float, logprob: float = -1.0):
    return Trajectory(
        choices=[
            SampledChoice(
                message={"role": "assistant", "content": "x"},
                prompt_token_ids=prompt,
                token_ids=sampled,
                logprobs=[logprob] * len(sampled),
                policy="checked@0",
            )
        ],
        reward=reward,
    )


async def test_training_input_is_checked_at_the_wire(server, fault_matrix):
    backend = RemoteBackend(server.url, KEY, retry_for_s=300)
    model = tiny(server, "checked")
    await model.register(backend)
    bad_id = [_trajectory([1, 2], [3, 10**9], 1.0), _trajectory([1, 2], [3, 4], 0.0)]
    started = time.monotonic()
    with pytest.raises(TrainingDataError, match="1000000000") as refused:
        await model.train([TrajectoryGroup(bad_id)])
    seconds = time.monotonic() - started
    assert seconds < 10, "a refused upload was retried"
    assert "vocabulary of 49152" in str(refused.value)
    too_long = [_trajectory([1] * 600, [3], 1.0), _trajectory([1, 2], [3], 0.0)]
    with pytest.raises(TrainingDataError, match="max_model_len of 512"):
        await model.train([TrajectoryGroup(too_long)])
    # NaN cannot be written by RemoteBackend (JSON has none), but the literal is accepted
    # by Python's and pydantic's parsers: sent by hand, it must be refused too.
    request = TrainRequest(
        request_id=uuid.uuid4().hex,
        model={"name": "checked", "project": "faults", "base_model": model.base_model},
        groups=[TrajectoryGroup([_trajectory([1], [2], 1.0), _trajectory([1], [2], 0.0)])],
    )
    body = request.model_dump_json().replace('"reward":1.0', '"reward":NaN', 1)
    assert "NaN" in body
    async with client(server) as http:
        nan = await http.post(f"{API_PREFIX}/train", content=body)
    assert nan.status_code == 400 and nan.json()["error"]["code"] == "invalid_training_data"
    assert "reward nan" in nan.json()["error"]["message"]
    assert on_disk(server, "faults", "checked") == "checkpoints []; 0 upload file(s)"
    assert not (server.root / "faults" / "checked" / "trajectories").exists()
    fault_matrix.record(
        "an upload with a token id of 10^9 (outside the vocabulary), a call longer than "
        "max_model_len, or a NaN reward",
        "HTTP 400 `invalid_training_data` naming the trajectory, the place, the value and the "
        "fix; RemoteBackend raises TrainingDataError at once (never retried)",
        on_disk(server, "faults", "checked") + ", no trajectories",
    )
    await backend.close()


async def test_one_request_id_sent_eight_times_at_once_trains_once(server, fault_matrix):
    backend = RemoteBackend(server.url, KEY)
    model = tiny(server, "twice", learning_rate=1e-3)
    await model.register(backend)
    request = TrainRequest(
        request_id=uuid.uuid4().hex,
        model={"name": "twice", "project": "faults", "base_model": model.base_model},
        groups=await scored_groups(model),
    )
    body = request.model_dump_json()
    async with client(server) as http:
        before = (await http.get(f"{API_PREFIX}/metrics")).json()

        async def send() -> dict:
            while True:  # 429 past max_pending_trains (4): retried, as RemoteBackend does
                response = await http.post(f"{API_PREFIX}/train", content=body)
                if response.status_code != 429:
                    return json.loads(response.text.splitlines()[-1])
                await asyncio.sleep(0.2)

        answers = await asyncio.gather(*(send() for _ in range(8)))
        after = (await http.get(f"{API_PREFIX}/metrics")).json()
    assert [a["event"] for a in answers] == ["result"] * 8, answers
    assert {a["result"]["step"] for a in answers} == {1}
    assert after["train_started"] - before.get("train_started", 0) == 1
    assert checkpoints(server, "faults", "twice") == ["000001"]
    fault_matrix.record(
        "one request id uploaded 8 times at once",
        "all 8 get the result of step 1 (one trains, the others attach to it or replay it)",
        on_disk(server, "faults", "twice"),
    )
    await backend.close()


async def test_a_body_that_trickles_in_is_cut_off(server, fault_matrix):
    request_id = uuid.uuid4().hex
    head = (
        f"POST {API_PREFIX}/train HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100000\r\nConnection: close\r\n\r\n"
    )
    partial = '{"request_id": "' + request_id + '", "model": {"name": "slow", '
    started = time.monotonic()
    answer = await asyncio.to_thread(raw_request, server, (head + partial).encode(), 0.5)
    waited = time.monotonic() - started
    assert status_of(answer) == 408, answer[:300]
    assert b"upload_timeout" in answer
    assert waited < 30
    assert not list(server.root.rglob(f"{request_id}*"))
    async with client(server) as http:
        metrics = (await http.get(f"{API_PREFIX}/metrics")).json()
    assert metrics["rejected_slow_upload"] >= 1
    fault_matrix.record(
        "an upload that stops arriving half way (a slow or stalled client)",
        f"HTTP {status_of(answer)} `upload_timeout` after --upload-timeout-s (3 s here); "
        "its slot is free again",
        "nothing written",
    )


def test_the_engine_is_private_and_keeps_no_server_secret(server, fault_matrix):
    pid = server.engine_pid()
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert not any(v.startswith(b"RLCOACH_API_KEY=") for v in environ)
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    assert KEY.encode() not in cmdline and b"KEY" not in cmdline
    uds = cmdline.split(b"\0")[cmdline.split(b"\0").index(b"--uds") + 1].decode()
    assert os.stat(Path(uds).parent).st_mode & 0o777 == 0o700
    # Without the engine's key, even a process of the same user cannot load an adapter.
    transport = httpx.HTTPTransport(uds=uds)
    with httpx.Client(transport=transport, base_url="http://engine") as engine:
        refused = engine.post(
            "/v1/load_lora_adapter", json={"lora_name": "evil", "lora_path": "/tmp"}
        )
    assert refused.status_code == 401
    # Another user cannot even reach the socket (the folder is 0700).
    probe = (
        "import os, socket\nos.setgid(65534); os.setuid(65534)\n"
        f"s = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect({uds!r}); print('connected')\n"
        "except OSError as e:\n    print(type(e).__name__)\n"
    )
    other = "skipped (not root)"
    if os.geteuid() == 0:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
        other = done.stdout.strip()
        assert other == "PermissionError", done
    fault_matrix.record(
        "another local user, or a process without the engine's key, tries to swap the served "
        "adapter",
        f"the engine listens on a Unix socket in a 0700 folder ({other} for another user) and "
        f"answers {refused.status_code} without this start's random key; the key is in the "
        "engine's environment only, $RLCOACH_API_KEY is not",
        "nothing written",
    )


async def test_a_lora_rank_the_engine_refuses_is_refused_at_registration(server, fault_matrix):
    backend = RemoteBackend(server.url, KEY)
    model = tiny(server, "wide", lora={"rank": 32})
    with pytest.raises(ConfigError, match="max_lora_rank") as refused:
        await model.register(backend)
    assert "rank 32" in str(refused.value)
    fault_matrix.record(
        "a model with LoRA rank 32 on an engine started with max_lora_rank 16",
        "HTTP 400 at registration naming both ranks and the fix (before: every publish failed)",
        "nothing written" if not (server.root / "faults" / "wide").exists() else "a run folder",
    )
    await backend.close()


async def test_an_unexpected_step_failure_is_final_not_retried(server, fault_matrix):
    backend = RemoteBackend(server.url, KEY, retry_for_s=300)
    model = tiny(server, "buggy")
    await model.register(backend)
    # A chat record whose tool_calls is a string trips the chat-template helper with an
    # AttributeError: a failure no retry can fix.
    record = ChatRecord(
        messages=[*QUESTION, {"role": "assistant", "content": "x", "tool_calls": "x"}]
    )
    started = time.monotonic()
    with pytest.raises(RemoteError, match="internal error") as failed:
        await model.train_sft([record])
    seconds = time.monotonic() - started
    assert not failed.value.retryable and seconds < 30
    fault_matrix.record(
        "a step fails with an error rlcoach did not foresee (a bug: AttributeError)",
        "an `error` event `internal error: AttributeError…`, retryable=false; RemoteBackend "
        "raises at once (before: retried for 900 s)",
        on_disk(server, "faults", "buggy"),
    )
    await backend.close()


async def _wait_health(http: httpx.AsyncClient, within_s: float) -> tuple[int, str]:
    """Poll /health until it answers 200 or time runs out; the last status and message."""
    deadline = time.monotonic() + within_s
    status, message = 0, ""
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            response = await http.get("/health")
            status = response.status_code
            message = "" if status == 200 else response.json()["error"]["message"]
            if status == 200:
                break
        await asyncio.sleep(0.3)
    return status, message


@pytest.fixture(scope="module")
async def trained(server):
    """A model with two trained steps on this server (for the engine-fault tests)."""
    backend = RemoteBackend(server.url, KEY, retry_for_s=300)
    model = tiny(server, "engine", learning_rate=1e-3)
    await model.register(backend)
    for _ in range(2):
        await model.train(await scored_groups(model))
    assert model.step == 2
    yield model
    await backend.close()


async def test_engine_killed_during_rollouts_fails_fast_then_serves_the_latest(
    server, trained, fault_matrix
):
    client_ = trained.openai_client()
    pid = await asyncio.to_thread(server.engine_pid)
    rollouts = [
        asyncio.create_task(
            client_.with_options(max_retries=0).chat.completions.create(
                model="engine", messages=QUESTION, max_tokens=200, temperature=1.0
            )
        )
        for _ in range(4)
    ]
    await asyncio.sleep(0.3)
    os.kill(pid, signal.SIGKILL)
    started = time.monotonic()
    await asyncio.gather(*rollouts, return_exceptions=True)  # done or failed, fast
    assert time.monotonic() - started < 30
    await asyncio.sleep(0.2)
    with pytest.raises(openai.APIStatusError) as refused:
        await client_.with_options(max_retries=0).chat.completions.create(
            model="engine", messages=QUESTION, max_tokens=2
        )
    refused_with = refused.value.status_code
    assert refused_with == 503 and refused.value.code == "engine_unavailable"
    async with client(server) as http:
        status, _ = await _wait_health(http, 60)
        assert status == 200
    reply = await client_.chat.completions.create(model="engine", messages=QUESTION, max_tokens=2)
    assert reply.model == "engine@2"
    assert (await asyncio.to_thread(server.engine_pid)) != pid
    fault_matrix.record(
        "the engine killed -9 while rollouts run",
        f"chats in flight and new ones fail at once with HTTP {refused_with} "
        "`engine_unavailable` "
        "(OpenAI clients retry it); the supervisor restarts the engine and `name` answers "
        "from the latest step again",
        on_disk(server, "faults", "engine"),
    )


async def test_engine_restarts_past_a_deleted_and_an_unreadable_checkpoint(
    server, trained, fault_matrix
):
    client_ = trained.openai_client()
    # Serve step 1 (loads its adapter), delete it, then kill the engine: the restart must
    # not try to load the deleted adapter again (before: KeyError, 503 forever).
    await client_.chat.completions.create(model="engine@1", messages=QUESTION, max_tokens=2)
    backend = trained.backend
    await backend.delete_checkpoint(trained, 1)
    os.kill(await asyncio.to_thread(server.engine_pid), signal.SIGKILL)
    async with client(server) as http:
        status, _ = await _wait_health(http, 60)
    assert status == 200
    fault_matrix.record(
        "an old checkpoint that was served is deleted, then the engine is killed -9",
        "the engine is back within seconds (only the latest adapter is reloaded; the deleted "
        "step answers 404 model_not_found)",
        on_disk(server, "faults", "engine"),
    )
    # Now the latest checkpoint is unreadable while the engine restarts (a network disk
    # gone for a moment): unavailable until it is back, then serving again (before: the
    # supervisor never cleared `unavailable` after a failed reload).
    latest = server.root / "faults" / "engine" / "checkpoints" / "000002"
    hidden = latest.with_name("hidden-000002")
    os.kill(await asyncio.to_thread(server.engine_pid), signal.SIGKILL)
    latest.rename(hidden)
    try:
        async with client(server) as http:
            deadline = time.monotonic() + 60
            message = ""
            while "could not be loaded" not in message and time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    response = await http.get("/health")
                    if response.status_code == 503:
                        message = response.json()["error"]["message"]
                await asyncio.sleep(0.3)
            assert "could not be loaded" in message
    finally:
        hidden.rename(latest)
    async with client(server) as http:
        status, _ = await _wait_health(http, 120)
    assert status == 200
    reply = await client_.chat.completions.create(model="engine", messages=QUESTION, max_tokens=2)
    assert reply.model == "engine@2"
    fault_matrix.record(
        "the engine is killed -9 while the latest checkpoint is unreadable",
        "HTTP 503 `engine_unavailable` (adapters could not be loaded again yet) while it is "
        "unreadable; serving again once it is back",
        on_disk(server, "faults", "engine"),
    )


async def test_an_engine_start_that_times_out_can_be_restarted(tiny_model_path, tmp_path):
    """The engine object itself: a start past startup_timeout_s kills what it started but
    keeps its client, so the supervisor's restart succeeds (before: the client was
    dropped and every restart timed out)."""
    from rlcoach.engines.transformers_process import TransformersProcessEngine

    config = EngineConfig(kind="transformers-process", startup_timeout_s=0.2)
    engine = TransformersProcessEngine(tiny_model_path, "tiny", config, tmp_path / "engine.log")
    with pytest.raises(EngineStartError, match="did not answer within"):
        await engine.start()
    assert engine.exit_code() is not None  # what it started is gone
    engine.config = config.model_copy(update={"startup_timeout_s": 120.0})
    try:
        await engine.restart()
        assert await engine.healthy()
    finally:
        await engine.close()


async def test_nan_is_never_trained_from_a_local_backend(tmp_path, tiny_model_path):
    """The same checks in process: LocalBackend takes Python floats, NaN included."""
    from rlcoach import LocalBackend

    backend = LocalBackend(tmp_path, engine={"kind": "transformers"})
    model = TrainableModel("local", "faults", base_model=str(tiny_model_path))
    await model.register(backend)
    groups = [TrajectoryGroup([_trajectory([1], [2], math.nan), _trajectory([1], [2], 0.0)])]
    with pytest.raises(TrainingDataError, match="reward nan"):
        await model.train(groups)
    bad = [TrajectoryGroup([_trajectory([1], [2], 1.0, math.inf), _trajectory([1], [2], 0.0)])]
    with pytest.raises(TrainingDataError, match="log-prob inf"):
        await model.train(bad)
    assert not backend.paths(model).trajectories.exists()
    await backend.close()


async def _train_once(http: httpx.AsyncClient, body: str) -> dict:
    """Upload one training request; its last event (retrying 429 and nothing else)."""
    while True:
        response = await http.post(f"{API_PREFIX}/train", content=body)
        if response.status_code != 429:
            return json.loads(response.text.splitlines()[-1])
        await asyncio.sleep(0.2)


async def test_a_publish_that_fails_leaves_no_step_and_the_retry_trains(server, fault_matrix):
    """The engine refuses the new adapter (HTTP 400, as vLLM does for one it cannot load:
    a failpoint in the engine process's load route), then dies while loading it."""
    backend = RemoteBackend(server.url, KEY)
    model = tiny(server, "refused", learning_rate=1e-3)
    await model.register(backend)
    request = TrainRequest(
        request_id=uuid.uuid4().hex,
        model={"name": "refused", "project": "faults", "base_model": model.base_model},
        groups=await scored_groups(model),
    )
    body = request.model_dump_json()
    arm(server.failpoints, "engine.load_adapter", "raise")
    async with client(server) as http:
        refused = await _train_once(http, body)
        assert refused["event"] == "error" and not refused["retryable"], refused
        assert "refused adapter 'refused@1'" in refused["error"]["message"]
        # Wholly rolled back: nothing on disk, `refused` still means step 0.
        assert checkpoints(server, "faults", "refused") == []
        reply = await model.openai_client().chat.completions.create(
            model="refused", messages=QUESTION, max_tokens=2
        )
        assert reply.model == "refused@0"
        # The same request id again trains step 1 (before: answered "replayed" for a
        # step that never became latest, and every later step failed).
        retried = await _train_once(http, body)
        assert retried["event"] == "result" and retried["result"]["step"] == 1
        assert not retried["result"]["replayed"]
        # The engine killed -9 while it loads step 2: retryable; the retry trains step 2.
        arm(server.failpoints, "engine.load_adapter", "kill")
        crashed = await _train_once(
            http, body.replace(request.request_id, second := uuid.uuid4().hex)
        )
        assert crashed["event"] == "error" and crashed["retryable"], crashed
        status, _ = await _wait_health(http, 60)
        assert status == 200
        again = await _train_once(http, body.replace(request.request_id, second))
        assert again["event"] == "result" and again["result"]["step"] == 2
    assert checkpoints(server, "faults", "refused") == ["000001", "000002"]
    failed = server.root / "faults" / "refused" / "trajectories"
    kept = sorted(p.name for p in failed.glob("*-failed*.jsonl"))
    assert kept == ["000001-failed1.jsonl", "000002-failed1.jsonl"]
    fault_matrix.record(
        "the engine refuses the new adapter at publish (HTTP 400, e.g. one it cannot load)",
        f"an `error` event, retryable=false: `{refused['error']['message'][:60]}…`; `name` "
        "still answers from the previous step; the same request id sent again trains the "
        "step (before: answered `replayed` for a step that never became latest)",
        on_disk(server, "faults", "refused")
        + "; the failed attempt's batch kept as trajectories/<step>-failed1.jsonl",
    )
    fault_matrix.record(
        "the engine killed -9 while it loads the new adapter (during publish)",
        "an `error` event, retryable=true (RemoteBackend retries); the step is rolled back "
        "and the retry, once the supervisor has restarted the engine, trains it",
        on_disk(server, "faults", "refused"),
    )
    await backend.close()


async def test_serve_killed_at_each_point_of_a_step_trains_it_exactly_once(server, fault_matrix):
    """kill -9 of `rlcoach serve` at each point of a step (a failpoint SIGKILLs it there),
    a restart, and RemoteBackend's retry of the same request id."""
    backend = RemoteBackend(server.url, KEY, retry_for_s=300)
    model = tiny(server, "crashed", learning_rate=1e-3)
    await model.register(backend)
    seen = []
    for number, point in enumerate(
        ["step.trained", "checkpoint.renamed", "step.published", "step.committed"], start=1
    ):
        groups = await scored_groups(model)
        arm(server.failpoints, point, "kill")
        training = asyncio.create_task(model.train(groups))
        code = await asyncio.to_thread(server.process.wait, 120)
        assert code == -signal.SIGKILL
        folder = server.root / "faults" / "crashed" / "checkpoints"
        uncommitted = [p.parent.name for p in folder.glob(f"*/{UNCOMMITTED}")]
        await asyncio.to_thread(server.start)
        async with client(server) as http:  # registered again at start-up, before any retry
            served = (await http.get("/v1/models")).json()["data"]
        assert any(entry["id"].startswith("crashed@") for entry in served), served
        result = await asyncio.wait_for(training, 300)
        async with client(server) as http:
            metrics = (await http.get(f"{API_PREFIX}/metrics")).json()
        how = "replayed" if metrics.get("train_replayed") else "trained again"
        assert result.step == number == model.step, (point, result.step)
        assert how == ("replayed" if point == "step.committed" else "trained again"), point
        steps = [f"{n:06d}" for n in range(1, number + 1)]
        assert checkpoints(server, "faults", "crashed") == steps
        left = f", its uncommitted folder {uncommitted[0]} removed" if uncommitted else ""
        seen.append(f"{point}: {how}{left}")
    # The kill at step.committed fell between the commit and the step's metrics.jsonl
    # line: the restart's registration wrote it from the checkpoint, once.
    metrics = (server.root / "faults" / "crashed" / "metrics.jsonl").read_text()
    records = [json.loads(line) for line in metrics.splitlines() if line.strip()]
    lines = [r["step"] for r in records if r.get("event") == "train"]
    assert lines == [1, 2, 3, 4], lines
    fault_matrix.record(
        "`rlcoach serve` killed -9 at each point of a step: after the optimizer step, after "
        "the checkpoint folder's rename, after the publish and optimizer-state write, after "
        "the commit",
        "RemoteBackend retries the request id until the restarted server answers: the step "
        "is trained again where it had not committed, replayed where it had; " + "; ".join(seen),
        on_disk(server, "faults", "crashed")
        + " (steps 1-4, each trained exactly once; an uncommitted folder is removed at "
        f"registration); metrics.jsonl: train lines for steps {lines}, each once (the line "
        "of the step killed after its commit is written from its checkpoint at the restart)",
    )
    await backend.close()


async def test_sigterm_during_a_step_cancels_it_and_the_retry_trains_once(server, fault_matrix):
    """Runs last: stops the module's server mid-step and starts it again."""
    backend = RemoteBackend(server.url, KEY, retry_for_s=300)
    model = tiny(server, "stopped", learning_rate=1e-3)
    await model.register(backend)
    groups = await scored_groups(model, size=4)
    # Long sequences make the step last seconds on the tiny model.
    for trajectory in groups[0].trajectories:
        choice = trajectory.choices[0]
        trajectory.choices[0] = choice.model_copy(
            update={"prompt_token_ids": choice.prompt_token_ids * 8}
        )
    groups = groups * 8
    training = asyncio.create_task(model.train(groups))
    requests = server.root / "faults" / "stopped" / "requests"
    for _ in range(600):
        if requests.is_dir() and any(requests.glob("*.jsonl")):
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)
    started = time.monotonic()
    before = server.log.stat().st_size  # the module's log holds earlier tests' failures
    server.process.send_signal(signal.SIGTERM)
    code = await asyncio.to_thread(server.process.wait, 120)
    stopped_in = time.monotonic() - started
    assert code is not None and stopped_in < 60
    log = server.log.read_bytes()[before:].decode(errors="replace")
    assert "cancelled" in log or "Traceback" not in log, log[-3000:]
    stray = [n for n in checkpoints(server, "faults", "stopped") if not n.isdigit()]
    await asyncio.to_thread(server.start)
    result = await asyncio.wait_for(training, 300)
    assert result.step == 1 and model.step == 1
    assert checkpoints(server, "faults", "stopped") == ["000001"]
    fault_matrix.record(
        "`rlcoach serve` stopped (SIGTERM) in the middle of a step",
        "it exits within seconds, cancelling the step; the client retries the same request id "
        "after the restart and gets step 1",
        on_disk(server, "faults", "stopped")
        + (f"; stray folders {stray} before the restart cleaned them" if stray else ""),
    )
    await backend.close()
