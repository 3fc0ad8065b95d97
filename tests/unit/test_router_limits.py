"""The router's bounds: step parsing, forgetting a deleted checkpoint, a bounded wait for
an adapter slot, a failed publish that leaves nothing behind, the reload after a restart.

The engine is a light stand-in (the seam): these check the router's bookkeeping, which
is the same whatever engine loads the adapters; the real engines are exercised by
test_serve_faults.py and test_serve_vllm.py.
"""

import asyncio
from pathlib import Path

import pytest

from rlcoach.endpoint.router import Router
from rlcoach.errors import ConfigError, EngineError, UnknownModelError


class StandInEngine:
    base_name = "base"

    def __init__(self) -> None:
        self.loaded: list[str] = []
        self.refuse: set[str] = set()

    async def load_adapter(self, name: str, path: Path) -> None:
        if name in self.refuse:
            raise EngineError(f"refused {name}")
        self.loaded.append(name)

    async def unload_adapter(self, name: str) -> None:
        self.loaded.remove(name)


def router(max_loras: int = 2, wait: float = 0.2) -> tuple[Router, StandInEngine]:
    engine = StandInEngine()
    r = Router(engine, max_loras, wait_timeout_s=wait)
    r.register("m", 0, {1: Path("/c/1"), 2: Path("/c/2"), 3: Path("/c/3")})
    r.latest["m"] = 3
    return r, engine


@pytest.mark.parametrize("asked", ["m@²", "m@" + "9" * 5000, "m@-1", "m@1.0", "m@ 1"])
def test_steps_are_ascii_digits_of_bounded_length(asked):
    r, _ = router()
    with pytest.raises(UnknownModelError):
        r.resolve(asked)


async def test_a_forgotten_checkpoint_is_not_served_nor_reloaded_after_a_restart():
    r, engine = router()
    for name in ("m@1", "m@3"):
        await r.acquire(name)
        await r.release(name)
    r.forget("m@1")
    with pytest.raises(UnknownModelError):
        r.resolve("m@1")
    with pytest.raises(ConfigError, match="latest"):
        r.forget("m@3")
    engine.loaded.clear()  # the engine died
    await r.reload_all()
    assert engine.loaded == ["m@3"]


async def test_waiting_for_an_adapter_slot_is_bounded():
    r, _ = router(max_loras=1)
    await r.acquire("m@1")  # in flight, never released
    with pytest.raises(EngineError, match="slots"):
        await asyncio.wait_for(r.acquire("m@2"), 5)


async def test_a_refused_publish_changes_nothing():
    r, engine = router()
    engine.refuse.add("m@4")
    with pytest.raises(EngineError):
        await r.publish("m", 4, Path("/c/4"))
    assert r.latest["m"] == 3 and "m@4" not in r.checkpoints and "m@4" not in engine.loaded
    assert r.resolve("m") == ("m@3", "m@3")
