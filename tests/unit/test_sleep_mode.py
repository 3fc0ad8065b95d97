"""Sleep mode's hold on requests (colocation.py with the real Router), on its own.

The engine is a stand-in object (the one seam: vLLM's sleep mode needs a CUDA GPU;
tests/integration/test_colocation.py runs the whole path against a stand-in vLLM server
process). It records what reached it, so the test sees what waited where."""

import asyncio
from pathlib import Path

import pytest

from rlcoach import ConfigError, EngineConfig
from rlcoach.backend.colocation import check_sleep_mode, sleep_engine, wake_engine
from rlcoach.endpoint.router import Router


class RecordingEngine:
    base_name = "base"

    def __init__(self) -> None:
        self.log: list[str] = []
        self.asleep = False
        self.fail_sleep = False

    def sleep_unsupported(self) -> str | None:
        return None

    async def load_adapter(self, served_name: str, path: Path) -> None:
        assert not self.asleep, "an adapter was loaded into a sleeping engine"
        self.log.append(f"load {served_name}")

    async def unload_adapter(self, served_name: str) -> None:
        self.log.append(f"unload {served_name}")

    async def sleep(self) -> None:
        if self.fail_sleep:
            raise RuntimeError("sleep failed")
        self.asleep = True
        self.log.append("sleep")

    async def wake(self) -> None:
        self.asleep = False
        self.log.append("wake")


async def test_requests_wait_while_the_engine_sleeps_and_get_the_new_step():
    engine = RecordingEngine()
    router = Router(engine, max_loras=2)
    router.register("agent", 0, {})
    running = await router.acquire("agent")  # a request already on the engine
    assert running == ("agent@0", "base")
    sleeping = asyncio.create_task(sleep_engine(router, engine))
    await asyncio.sleep(0.01)
    assert not sleeping.done() and engine.log == []  # it waits for the running request
    held = asyncio.create_task(router.acquire("agent"))
    await router.release("base")
    assert await sleeping >= 0.0 and engine.log == ["sleep"]
    assert await wake_engine(engine) >= 0.0
    await asyncio.sleep(0.01)
    assert not held.done()  # still held after the wake: the new step is not served yet
    await router.publish("agent", 1, Path("/checkpoints/1"))
    assert await held == ("agent@1", "agent@1")  # answered by the step just trained
    assert engine.log == ["sleep", "wake", "load agent@1"]


async def test_a_failed_sleep_lets_requests_through_again():
    engine = RecordingEngine()
    engine.fail_sleep = True
    router = Router(engine, max_loras=2)
    router.register("agent", 0, {})
    with pytest.raises(RuntimeError, match="sleep failed"):
        await sleep_engine(router, engine)
    assert await asyncio.wait_for(router.acquire("agent"), 1.0) == ("agent@0", "base")


async def test_open_requests_ends_a_hold_without_a_publish():
    router = Router(RecordingEngine(), max_loras=2)
    router.register("agent", 0, {})
    await router.hold_requests()
    held = asyncio.create_task(router.acquire("agent"))
    await asyncio.sleep(0.01)
    assert not held.done()
    await router.open_requests()
    assert await held == ("agent@0", "base")


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
