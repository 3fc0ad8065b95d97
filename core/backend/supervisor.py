"""Engine supervision: a crashed inference engine is noticed, restarted and re-armed.

The vLLM engine is a subprocess; it can die (out of memory, a CUDA fault, a kill). The
supervisor runs on the gateway's loop and checks the process every second. When it has
died, the router is marked unavailable first, so every request — in flight or new —
fails at once with a retryable 503 instead of waiting on a dead socket; then a fresh
server starts, each model's latest adapter is loaded again from its checkpoint, and
requests flow again. Unavailable is cleared only once both have succeeded: a restart that
fails, or a reload that fails after a good restart (a checkpoint unreadable for a
moment), is tried again with a growing pause, never left half done.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol, runtime_checkable

from rlcoach.endpoint.router import Router

__all__ = ["EngineSupervisor", "RestartableEngine"]

logger = logging.getLogger(__name__)


@runtime_checkable
class RestartableEngine(Protocol):
    """An engine in its own process, which can die and be started again."""

    def exit_code(self) -> int | None:
        """The exit code once the process has died; None while it runs."""

    async def restart(self) -> None:
        """Kill what is left of the dead engine (its children), start it again (no adapter
        loaded) and return once it answers."""


class EngineSupervisor:
    """Watch one engine; restart it and reload the router's adapters after a crash."""

    def __init__(
        self,
        engine: RestartableEngine,
        router: Router,
        interval_s: float = 1.0,
        max_pause_s: float = 60.0,
    ) -> None:
        self.engine = engine
        self.router = router
        self.interval_s = interval_s
        self.max_pause_s = max_pause_s
        self.restarts = 0
        """Successful restarts so far (a metric)."""

    async def run(self) -> None:
        pause = self.interval_s
        recovering = False
        while True:
            await asyncio.sleep(pause)
            code = self.engine.exit_code()
            if code is None and not recovering:
                pause = self.interval_s
                continue
            recovering = True
            if code is not None:
                self.router.unavailable = (
                    f"the inference engine died (exit code {code}) and is being restarted"
                )
                logger.error("the inference engine died (exit code %s); restarting it", code)
                try:
                    await self.engine.restart()
                except Exception:
                    pause = min(pause * 2, self.max_pause_s)
                    logger.exception("restarting the engine failed; trying again in %.0f s", pause)
                    continue
            try:
                await self.router.reload_all()
            except Exception:
                pause = min(pause * 2, self.max_pause_s)
                self.router.unavailable = (
                    "the inference engine was restarted but its adapters could not be loaded "
                    "again yet"
                )
                logger.exception("reloading the adapters failed; trying again in %.0f s", pause)
                continue
            recovering = False
            self.restarts += 1
            self.router.unavailable = None
            pause = self.interval_s
            logger.warning("the inference engine is back (restart %d)", self.restarts)
