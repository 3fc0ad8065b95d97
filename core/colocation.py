"""Colocation: vLLM and the trainer on one GPU, side by side or taking turns.

`EngineConfig.colocation` chooses how one GPU is shared when it both serves and trains:

- "split" (the default): both stay resident. vLLM takes `gpu_memory_utilization` of the
  GPU for its weights, activations and KV cache, the trainer the rest. Rollouts and
  training can overlap (the async pipeline, pipeline.py); each has less memory.
- "sleep": they take turns. Around each training step the engine is put to sleep
  (vLLM level 1: weights offloaded to CPU memory, KV cache freed) and woken after it,
  so the trainer gets nearly the whole GPU while vLLM keeps a large KV cache; rollouts
  wait while the step trains, so the pipeline runs synchronously.

`SleepGate` wraps the engine the gateway and the router talk to: while the engine
sleeps, requests wait at the gate instead of reaching a server that cannot answer, and
`sleep()` first lets the requests already running finish. The engine itself does the
sleeping (`SleepingEngine`: `VLLMEngine` on a GPU, through vLLM's `POST /sleep?level=1`
and `POST /wake_up`, which need `--enable-sleep-mode` and `VLLM_SERVER_DEV_MODE=1`).
vLLM has no sleep mode on the CPU, and the transformers engine none at all: asking for
"sleep" there is refused when the model is registered (`check_sleep_mode`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, runtime_checkable

from rlcoach.errors import ConfigError

__all__ = ["SleepGate", "SleepingEngine", "check_sleep_mode", "release_gpu_cache"]

logger = logging.getLogger(__name__)

_GATED = frozenset(
    {"chat", "chat_stream", "load_adapter", "unload_adapter", "token_logprobs", "detokenize"}
)
"""Engine methods that need an awake engine; the rest (start, close, healthy, restart,
exit_code, ...) pass straight through."""


@runtime_checkable
class SleepingEngine(Protocol):
    """An engine that can free its GPU memory between rollouts and get it back."""

    def sleep_unsupported(self) -> str | None:
        """Why this engine cannot sleep here (None: it can)."""

    async def sleep(self) -> None:
        """Free the GPU: offload the weights, drop the KV cache. No request is running."""

    async def wake(self) -> None:
        """Take the GPU back; return once the engine answers requests again."""


def check_sleep_mode(
    engine: object, serve_gpus: tuple[int, ...], train_gpus: tuple[int, ...]
) -> None:
    """Refuse `colocation="sleep"` where it cannot work, naming the fix."""
    if not isinstance(engine, SleepingEngine):
        raise ConfigError(
            f"EngineConfig(colocation='sleep') needs an engine with a sleep mode, but the "
            f"{type(engine).__name__} has none; fix: use kind='vllm' on a GPU, or "
            "colocation='split' (the default)"
        )
    reason = engine.sleep_unsupported()
    if reason is not None:
        raise ConfigError(
            f"EngineConfig(colocation='sleep') cannot work here: {reason}; fix: "
            "colocation='split' (the default; on a CPU the engine and the trainer already "
            "take turns, since the loop trains only between rollouts)"
        )
    if serve_gpus and not set(serve_gpus) & set(train_gpus):
        raise ConfigError(
            f"EngineConfig(colocation='sleep') takes turns on one shared GPU, but vLLM "
            f"serves on GPU(s) {list(serve_gpus)} and the trainer trains on "
            f"{list(train_gpus)}; fix: colocation='split' (separate GPUs need no sleeping) "
            "or place both on one GPU (placement serve_gpus=[0], train_gpus=[0])"
        )


def release_gpu_cache() -> None:
    """Hand the trainer's cached, unused GPU blocks back to the driver, so a waking
    engine can take them (torch keeps freed blocks for reuse otherwise)."""
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


class SleepGate:
    """The engine as the gateway sees it: requests wait while it sleeps.

    Every method of the wrapped engine is reachable through the gate; the request
    methods (`_GATED`) wait until the engine is awake and are counted while they run,
    so `sleep()` can wait for them. Runs on the gateway's event loop, like the engine.
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._awake: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None
        self._running = 0
        self.sleeping = False

    def _events(self) -> tuple[asyncio.Event, asyncio.Event]:
        # Made on first use, on the gateway's loop (the gate is built on another thread).
        if self._awake is None or self._idle is None:
            self._awake, self._idle = asyncio.Event(), asyncio.Event()
            self._awake.set()
            self._idle.set()
        return self._awake, self._idle

    @contextlib.asynccontextmanager
    async def _admitted(self) -> AsyncIterator[None]:
        awake, idle = self._events()
        while not awake.is_set():  # a loop: the engine may fall asleep again before we run
            await awake.wait()
        self._running += 1
        idle.clear()
        try:
            yield
        finally:
            self._running -= 1
            if self._running == 0:
                idle.set()

    def _gated(self, method: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.isasyncgenfunction(method):

            async def stream(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
                async with self._admitted():
                    async for item in method(*args, **kwargs):
                        yield item

            return stream

        async def call(*args: Any, **kwargs: Any) -> Any:
            async with self._admitted():
                return await method(*args, **kwargs)

        return call

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.engine, name)
        if name in _GATED and callable(attribute):
            return self._gated(attribute)
        return attribute

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        async with self._admitted():
            return await self.engine.chat(body)

    async def sleep(self) -> float:
        """Stop admitting requests, let the running ones finish, put the engine to sleep;
        return the seconds it took (the wait for running requests included)."""
        started = time.perf_counter()
        awake, idle = self._events()
        awake.clear()
        await idle.wait()
        try:
            await self.engine.sleep()
        except BaseException:
            awake.set()
            raise
        self.sleeping = True
        seconds = time.perf_counter() - started
        logger.info("engine asleep after %.2f s", seconds)
        return seconds

    async def wake(self) -> float:
        """Wake the engine and admit requests again; return the seconds it took."""
        started = time.perf_counter()
        awake, _ = self._events()
        try:
            if self.sleeping:
                await self.engine.wake()
        finally:
            # Even when waking failed: requests then fail at the engine, with its error,
            # instead of waiting at the gate for ever.
            self.sleeping = False
            awake.set()
        seconds = time.perf_counter() - started
        logger.info("engine awake after %.2f s", seconds)
        return seconds
