"""The engine client (engines/http.py) on both of its transports, against a real server
process: the stand-in vLLM (bench/standin_vllm.py) on a Unix socket with a key, as
rlcoach starts engines. aiohttp is what runs wherever vLLM is installed; httpx is the
fallback where aiohttp is missing, forced here with `use_aiohttp=False`."""

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlcoach.engines.http import EngineConnectionError, EngineHTTP

STANDIN = Path(__file__).parents[2] / "bench" / "standin_vllm.py"


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    socket_path = tmp_path_factory.mktemp("engine") / "engine.sock"
    command = [sys.executable, str(STANDIN), "--uds", str(socket_path)]
    command += ["--served-model-name", "base", "--completion-tokens", "8"]
    env = {**os.environ, "VLLM_API_KEY": "engine-key"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # until the server accepts connections
        with socket.socket(socket.AF_UNIX) as probe:
            if probe.connect_ex(str(socket_path)) == 0:
                break
        time.sleep(0.05)
    yield socket_path
    process.terminate()
    process.wait(10)


@pytest.mark.parametrize("use_aiohttp", [True, False])
async def test_requests_reach_the_engine_socket_with_its_key(standin, use_aiohttp):
    def client(key: str) -> EngineHTTP:
        headers = {"Authorization": f"Bearer {key}"}
        return EngineHTTP(
            "http://engine",
            uds=str(standin),
            headers=headers,
            timeout_s=10.0,
            use_aiohttp=use_aiohttp,
        )

    keyed, wrong = client("engine-key"), client("other")
    assert keyed.backend == ("aiohttp" if use_aiohttp else "httpx")
    try:
        body = {"model": "base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        answers = await asyncio.gather(
            *(keyed.request("POST", "/v1/chat/completions", json=body) for _ in range(16))
        )
        assert {a.status_code for a in answers} == {200}
        assert [len(a.json()["choices"][0]["token_ids"]) for a in answers] == [4] * 16
        refused = await wrong.request("POST", "/v1/chat/completions", json=body)
        assert refused.status_code == 401 and refused.reason_phrase == "Unauthorized"
        health = await wrong.request("GET", "/health", timeout_s=5.0)  # no key needed
        assert health.status_code == 200
    finally:
        await keyed.aclose()
        await wrong.aclose()
    gone = EngineHTTP(
        "http://engine", uds=str(standin) + ".missing", timeout_s=5.0, use_aiohttp=use_aiohttp
    )
    with pytest.raises(EngineConnectionError, match="/health"):
        await gone.request("GET", "/health")
    await gone.aclose()
