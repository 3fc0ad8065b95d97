"""Colocation: vLLM and the trainer on one GPU, side by side or taking turns.

`EngineConfig.colocation` chooses how one GPU is shared when it both serves and trains:

- "split" (the default): both stay resident. vLLM takes `gpu_memory_utilization` of the
  GPU for its weights, activations and KV cache, the trainer the rest. Rollouts and
  training can overlap (the async pipeline, pipeline.py); each has less memory.
- "sleep": they take turns. Around each training step the engine is put to sleep
  (vLLM level 1: weights offloaded to CPU memory, KV cache freed) and woken after it,
  so the trainer gets nearly the whole GPU while vLLM keeps a large KV cache; rollouts
  wait while the step trains, so the pipeline runs synchronously.

Sleeping goes through the router (router.py): new requests are held there, as during a
publish, the ones already running finish, then the engine sleeps (`sleep_engine`). It
wakes after the step (`wake_engine`) and the held requests stay held until the new
adapter is published, so they are answered by the new step (or, when nothing was
published, until `Router.open_requests`). The engine does the sleeping
(`SleepingEngine`: `VLLMEngine` on a GPU, through vLLM's `POST /sleep?level=1` and `POST
/wake_up`, which need `--enable-sleep-mode` and `VLLM_SERVER_DEV_MODE=1`). vLLM has no
sleep mode on the CPU, and the transformers engine none at all: asking for "sleep" there
is refused when the model is registered (`check_sleep_mode`).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from rlcoach.errors import ConfigError

if TYPE_CHECKING:
    from rlcoach.endpoint.router import Router

__all__ = [
    "SleepingEngine",
    "check_sleep_mode",
    "release_gpu_cache",
    "sleep_engine",
    "wake_engine",
]

logger = logging.getLogger(__name__)


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


async def sleep_engine(router: Router, engine: SleepingEngine) -> float:
    """Hold new requests, let the running ones finish, put the engine to sleep; return
    the seconds it took (the wait included). Runs on the gateway's loop."""
    started = time.perf_counter()
    await router.hold_requests()
    try:
        await router.wait_idle()
        await engine.sleep()
    except BaseException:
        await router.open_requests()
        raise
    seconds = time.perf_counter() - started
    logger.info("engine asleep after %.2f s", seconds)
    return seconds


async def wake_engine(engine: SleepingEngine) -> float:
    """Wake the engine (requests stay held until the next publish or `open_requests`);
    return the seconds it took."""
    started = time.perf_counter()
    await engine.wake()
    seconds = time.perf_counter() - started
    logger.info("engine awake after %.2f s", seconds)
    return seconds
