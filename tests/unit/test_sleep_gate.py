"""The gate in front of a sleeping engine (colocation.py), on its own.

The engine behind the gate is a stand-in object (the one seam: vLLM's sleep mode needs
a CUDA GPU; tests/integration/test_colocation.py runs the whole path against a stand-in
vLLM server process). It records what reached it and holds each chat until released,
so the test can see what waits where."""

import asyncio

import pytest

from rlcoach import ConfigError, EngineConfig
from rlcoach.colocation import SleepGate, check_sleep_mode


class RecordingEngine:
    base_name = "base"

    def __init__(self) -> None:
        self.log: list[str] = []
        self.release = asyncio.Event()
        self.asleep = False

    def sleep_unsupported(self) -> str | None:
        return None

    async def chat(self, body):
        assert not self.asleep, "a chat reached a sleeping engine"
        self.log.append(f"chat {body['n']} start")
        await self.release.wait()
        self.log.append(f"chat {body['n']} end")
        return {"n": body["n"]}

    async def chat_stream(self, body):
        assert not self.asleep, "a stream reached a sleeping engine"
        for i in range(2):
            yield {"chunk": i}

    async def sleep(self) -> None:
        self.asleep = True
        self.log.append("sleep")

    async def wake(self) -> None:
        self.asleep = False
        self.log.append("wake")

    async def healthy(self) -> bool:
        return True


async def test_sleep_waits_for_running_requests_and_new_ones_wait_for_wake():
    engine = RecordingEngine()
    gate = SleepGate(engine)
    first = asyncio.create_task(gate.chat({"n": 1}))
    await asyncio.sleep(0.01)
    sleeping = asyncio.create_task(gate.sleep())
    await asyncio.sleep(0.01)
    assert not sleeping.done()  # chat 1 still runs
    second = asyncio.create_task(gate.chat({"n": 2}))
    engine.release.set()
    assert (await first)["n"] == 1
    assert await sleeping >= 0.0 and gate.sleeping
    await asyncio.sleep(0.02)
    assert not second.done()  # held at the gate while the engine sleeps
    assert engine.log == ["chat 1 start", "chat 1 end", "sleep"]
    assert await gate.wake() >= 0.0
    assert (await second)["n"] == 2
    assert engine.log[-3:] == ["wake", "chat 2 start", "chat 2 end"]
    assert [c async for c in gate.chat_stream({})] == [{"chunk": 0}, {"chunk": 1}]
    assert await gate.healthy() is True  # not gated: passes straight through


async def test_a_failed_wake_opens_the_gate_and_raises():
    engine = RecordingEngine()

    async def broken() -> None:
        raise RuntimeError("wake failed")

    engine.wake = broken
    gate = SleepGate(engine)
    await gate.sleep()
    with pytest.raises(RuntimeError, match="wake failed"):
        await gate.wake()
    engine.asleep = False
    engine.release.set()
    assert (await asyncio.wait_for(gate.chat({"n": 3}), 1.0))["n"] == 3


def test_sleep_mode_is_refused_where_it_cannot_work():
    class NoSleep:
        pass

    with pytest.raises(ConfigError, match="NoSleep has none"):
        check_sleep_mode(NoSleep(), (), ())

    class CpuEngine(RecordingEngine):
        def sleep_unsupported(self) -> str | None:
            return "vLLM runs on the CPU here"

    with pytest.raises(ConfigError, match="runs on the CPU here; fix: colocation='split'"):
        check_sleep_mode(CpuEngine(), (), ())
    with pytest.raises(ConfigError, match="serves on GPU"):
        check_sleep_mode(RecordingEngine(), (0,), (1,))
    check_sleep_mode(RecordingEngine(), (0,), (0,))
    assert EngineConfig().colocation == "split"
