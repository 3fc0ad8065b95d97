"""Served names and adapter swaps: which adapter answers `name`, `name@step` or the base.

Every trainable model is served as `name@step` (step 0 is the base weights) and as plain
`name`, which means its latest step. The engine holds at most `max_loras` adapters; one
asked for by an older `name@step` is loaded again from its checkpoint on demand, the
least recently used idle one making room. Publishing a new step holds new requests until
the new adapter is loaded, so a request for `name` never lands on the old weights after
publish returns, while requests already running finish on the version they started with
(the old adapter is only evicted once nothing runs on it). Runs on the gateway's loop.

Every wait is bounded: a load that needs a slot while every loaded adapter is serving
requests waits at most `wait_timeout_s`, then fails with a retryable `EngineError`. A
checkpoint deleted on disk is forgotten here (`forget`), and after an engine restart only
each model's latest adapter is loaded again (`reload_all`); older ones load on demand, so
a deleted or unreadable old checkpoint cannot keep the engine unavailable.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from pathlib import Path

from rlcoach.engines.base import Engine
from rlcoach.errors import ConfigError, EngineError, UnknownModelError
from rlcoach.models.served_name import ServedName

__all__ = ["Router"]

logger = logging.getLogger(__name__)


class Router:
    """Map requested model names to engine names and keep the right adapters loaded."""

    def __init__(
        self,
        engine: Engine,
        max_loras: int,
        wait_timeout_s: float = 120.0,
        on_unload: Callable[[Path], None] | None = None,
    ) -> None:
        self.engine = engine
        self.on_unload = on_unload
        """Called with the folder an adapter was loaded from once the engine no longer
        holds it (its files may go: backend/serving_copies.py)."""
        self.max_loras = max_loras
        self.wait_timeout_s = wait_timeout_s
        self.latest: dict[str, int] = {}
        self.checkpoints: dict[str, Path] = {}
        self._loaded: OrderedDict[str, Path] = OrderedDict()
        """Engine names the engine holds -> the folder each was loaded from."""
        self._inflight: Counter[str] = Counter()
        self._idle = asyncio.Condition()
        self._swap_done = asyncio.Event()
        self._swap_done.set()
        self._load_lock = asyncio.Lock()
        self.unavailable: str | None = None
        """Why the engine cannot answer now (a restart after a crash); requests fail fast."""

    def served_names(self) -> list[str]:
        names = [self.engine.base_name]
        for model, latest in sorted(self.latest.items()):
            names += [
                str(ServedName(model, step))
                for step in range(latest + 1)
                if step == 0 or str(ServedName(model, step)) in self.checkpoints
            ]
        return names

    def register(self, model: str, step: int, checkpoints: dict[int, Path]) -> None:
        """Know `model`, its latest step and the checkpoint folder of each step."""
        self.latest[model] = step
        for number, path in checkpoints.items():
            self.checkpoints[str(ServedName(model, number))] = path

    def resolve(self, requested: str) -> tuple[str, str]:
        """Return (served name to report, engine name to ask) for a requested model."""
        if requested == self.engine.base_name:
            return requested, requested
        name, step_text = ServedName.split(requested)
        if name in self.latest:
            if not step_text:
                step = self.latest[name]
            else:
                parsed = ServedName.parse(requested)
                step = parsed.step if parsed is not None else -1
            served = str(ServedName(name, step))
            if step == 0:
                return served, self.engine.base_name
            if step > 0 and served in self.checkpoints:
                return served, served
        known = ", ".join(self.served_names())
        raise UnknownModelError(
            f"model {requested!r} is not served here: "
            + (
                f"{name!r} has no step {step_text!r}"
                if name in self.latest
                else f"no model named {name!r} is registered"
            )
            + f"; fix: use one of {known} (plain `name` means its latest step)"
        )

    async def acquire(self, requested: str) -> tuple[str, str]:
        """Resolve and mark a request in flight (wait out a swap; load on demand)."""
        if self.unavailable is not None:
            raise EngineError(self.unavailable)
        await self._swap_done.wait()
        served, engine_name = self.resolve(requested)
        if engine_name != self.engine.base_name:
            await self._ensure_loaded(engine_name)
            self._loaded.move_to_end(engine_name)
        self._inflight[engine_name] += 1
        return served, engine_name

    async def release(self, engine_name: str) -> None:
        async with self._idle:
            self._inflight[engine_name] -= 1
            self._idle.notify_all()

    async def publish(self, model: str, step: int, path: Path) -> float:
        """Serve `path` as `model@step` and make it `model`'s latest; return seconds held.

        On failure nothing changes: the step is not served, not latest, not known."""
        started = time.perf_counter()
        self._swap_done.clear()
        served = str(ServedName(model, step))
        known = self.checkpoints.get(served)
        try:
            self.checkpoints[served] = path
            await self._ensure_loaded(served, reload=True)
            self.latest[model] = step
        except BaseException:
            if known is None:
                self.checkpoints.pop(served, None)
            else:
                self.checkpoints[served] = known
            raise
        finally:
            self._swap_done.set()
        held = time.perf_counter() - started
        logger.info("published %s in %.0f ms", served, held * 1000)
        return held

    def relocate(self, served: str, path: Path) -> None:
        """Load `served` from `path` from now on (the adapter the engine holds stays):
        a published step's committed checkpoint replaces its serving copy."""
        if served in self.checkpoints:
            self.checkpoints[served] = path

    def withdraw(self, model: str, step: int, previous: int) -> None:
        """Undo `publish(model, step, ...)`: a step that failed after its publish never
        happened, so `model` means `model@previous` again and `model@step` is not served
        (requests running on it finish; its adapter is the first to be evicted, and a
        later publish of the same step loads the new one in its place)."""
        if self.latest.get(model) == step:
            self.latest[model] = previous
        self.checkpoints.pop(str(ServedName(model, step)), None)

    def forget(self, served: str) -> None:
        """Stop serving `served` (its checkpoint is being deleted); never a model's latest.
        Requests running on it finish; the engine drops it when its slot is next needed."""
        parsed = ServedName.parse(served)
        name = parsed.model if parsed else ServedName.split(served)[0]
        if parsed is not None and self.latest.get(name) == parsed.step:
            raise ConfigError(
                f"{served} is the latest step of {name!r}; fix: train a newer step first"
            )
        self.checkpoints.pop(served, None)

    async def reload_all(self) -> None:
        """After an engine restart: load each model's latest adapter again. The others
        this router had loaded are forgotten as loaded and come back on demand."""
        async with self._load_lock:
            wanted = {str(ServedName(m, s)) for m, s in self.latest.items() if s > 0}
            reloaded = {self.checkpoints[name] for name in wanted}
            for engine_name, path in list(self._loaded.items()):
                del self._loaded[engine_name]
                if path not in reloaded:
                    self._unloaded(path)
            for engine_name in sorted(wanted):
                path = self.checkpoints[engine_name]
                await self.engine.load_adapter(engine_name, path)
                self._loaded[engine_name] = path

    async def _ensure_loaded(self, engine_name: str, reload: bool = False) -> None:
        async with self._load_lock:
            if engine_name in self._loaded:
                if not reload:
                    return
                await self.engine.unload_adapter(engine_name)
                self._unloaded(self._loaded.pop(engine_name))
            while len(self._loaded) >= self.max_loras and engine_name not in self._loaded:
                await self._evict_one(keep=engine_name)
            path = self.checkpoints[engine_name]
            await self.engine.load_adapter(engine_name, path)
            self._loaded[engine_name] = path

    def _idle_victim(self, keep: str) -> str | None:
        """The least recently used loaded adapter with nothing running on it: first any
        the router no longer serves (a deleted checkpoint), then by use."""
        idle = [n for n in self._loaded if n != keep and self._inflight[n] == 0]
        forgotten = [n for n in idle if n not in self.checkpoints]
        candidates = forgotten or idle
        return candidates[0] if candidates else None

    async def _evict_one(self, keep: str) -> None:
        async with self._idle:
            try:
                found = await asyncio.wait_for(
                    self._idle.wait_for(lambda: self._idle_victim(keep)), self.wait_timeout_s
                )
            except TimeoutError as e:
                raise EngineError(
                    f"all {self.max_loras} adapter slots of the engine were busy serving "
                    f"requests for {self.wait_timeout_s:.0f} s, so {keep!r} could not be "
                    "loaded; retry shortly, or start the engine with a larger "
                    "EngineConfig.max_loras"
                ) from e
        victim = str(found)  # wait_for returned once a victim was found
        await self.engine.unload_adapter(victim)
        path = self._loaded.pop(victim, None)
        if path is not None:
            self._unloaded(path)

    def _unloaded(self, path: Path) -> None:
        if self.on_unload is not None:
            self.on_unload(path)

    async def hold_requests(self) -> None:
        """Hold new requests, as a publish does, until `open_requests` or the end of the
        next publish (colocation.py: while the engine sleeps)."""
        self._swap_done.clear()

    async def open_requests(self) -> None:
        self._swap_done.set()

    async def wait_idle(self) -> None:
        """Return once no request is running on any adapter or the base model."""
        async with self._idle:
            await self._idle.wait_for(lambda: not any(self._inflight.values()))
