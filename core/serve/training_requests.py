"""Training requests: each request id trained once, answered as a stream of events.

`rlcoach serve` takes RL and SFT steps as uploads (`POST /rlcoach/v1/train`,
`/train_sft`); `TrainingRequests` runs them:

- A request id is claimed before the first await, so two uploads of one id at once
  train once; a retry of an id that is running attaches to it.
- The groups or examples are written to disk (`requests/<id>.jsonl`) before the upload
  is acknowledged; a disk that refuses them answers 507 and nothing is trained.
- The step runs as a task of its own (a client that hangs up does not cancel it), one
  step per model at a time, and its result is kept on disk (`requests/<id>.result.json`).
  A retry of a finished id gets the first result (replay), found in the result file or
  in the checkpoint's step record (step_records.py), which is renamed into place with
  the adapter, so a kill -9 between the rename and the answer loses nothing.
- The answer is NDJSON `TrainEvent`s: accepted, training, a heartbeat every
  `heartbeat_s`, then the result or the error. An error is retryable only when it says
  so (an `RLCoachError` marked `retryable`: the engine or the training ranks died);
  anything else, a bug included, is final, so a deterministic failure is not retrained
  for the client's whole retry budget.
- After each finished step the retention policy (retention.py) prunes old checkpoints
  (no longer served), optimizer states, request files and engine logs; it never touches
  the latest step, and a failure to prune never fails the step.
- At shutdown the running steps are cancelled and waited for (`cancel_all`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from rlcoach.backend.local import LocalBackend, StepResult
from rlcoach.backend.retention import RetentionConfig, apply_retention
from rlcoach.endpoint.gateway import Gateway
from rlcoach.errors import ConfigError, EngineError, RLCoachError, TrainingDataError
from rlcoach.model import TrainableModel
from rlcoach.models.served_name import ServedName
from rlcoach.paths import RunPaths, write_text_atomic
from rlcoach.serve.refusal import Refusal
from rlcoach.serve.step_records import finished_step, step_result_wire
from rlcoach.serve.wire import StepResultWire, TrainEvent, error_body

__all__ = ["Step", "TrainingRequests", "stop_serving"]

logger = logging.getLogger(__name__)

Step = Callable[[TrainableModel], Awaitable[StepResult]]
"""The training of one request (RL or SFT) on its model."""


class TrainingRequests:
    """The training requests uploading or running, by request id."""

    def __init__(
        self,
        backend: LocalBackend,
        root: Path,
        counters: Counter[str],
        *,
        max_pending: int,
        heartbeat_s: float,
        retention: RetentionConfig,
    ) -> None:
        self.backend = backend
        self.root = root
        self.counters = counters
        """The server's counters (served in /metrics)."""
        self.max_pending = max_pending
        self.heartbeat_s = heartbeat_s
        self.retention = retention
        self._trains: dict[str, asyncio.Task[StepResultWire]] = {}
        self._admitted: dict[str, asyncio.Future[None]] = {}
        self._uploads = 0
        self._model_locks: dict[str, asyncio.Lock] = {}

    @property
    def running(self) -> int:
        """Requests whose step is running (or waiting for its model's previous one)."""
        return len(self._trains)

    @contextlib.contextmanager
    def upload_slot(self) -> Iterator[None]:
        """Room for one more training upload, held while its body arrives; 429 when
        `max_pending` requests are already uploading or running."""
        if len(self._trains) + self._uploads >= self.max_pending:
            self.counters["rejected_busy"] += 1
            raise Refusal(
                429,
                f"{self.max_pending} training requests are "
                "already uploading or running; retry once one finishes",
                code="busy",
                kind="rate_limit_error",
            )
        self._uploads += 1
        try:
            yield
        finally:
            self._uploads -= 1

    async def start(
        self,
        request_id: str,
        model: TrainableModel,
        paths: RunPaths,
        items: Sequence[BaseModel],
        step: Step,
        kind: str,
    ) -> AsyncIterator[bytes]:
        """Run `step` once per request id; its events (or its first result) once the
        upload is on disk."""
        task = self._trains.get(request_id)
        if task is None:
            # Claimed with no await between the check and the claim: an upload of the
            # same id arriving meanwhile attaches to this task instead of training again.
            admitted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            task = asyncio.create_task(
                self._run_step(model, request_id, items, step, kind, paths, admitted)
            )
            self._trains[request_id] = task
            self._admitted[request_id] = admitted

            def forget(_: object) -> None:
                self._trains.pop(request_id, None)
                self._admitted.pop(request_id, None)

            task.add_done_callback(forget)
        else:
            self.counters["train_attached"] += 1
            admitted = self._admitted[request_id]
        # The upload is on disk (or known trained) before it is acknowledged.
        try:
            await asyncio.shield(admitted)
        except OSError as e:
            self.counters["train_failed"] += 1
            raise Refusal(
                507,
                f"the upload could not be written to disk ({e}); nothing was trained — "
                "fix: free space under the server's --root, then send it again",
                kind="server_error",
                code="storage_error",
            ) from e
        return self._events(request_id, task)

    async def cancel_all(self) -> None:
        """Cancel the running steps and wait for them (at most a minute). Steps stop at
        their next await (a running optimizer step finishes in its thread, but nothing
        after it is written); clients retry after a restart."""
        running = list(self._trains.values())
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running, timeout=60)

    async def _run_step(
        self,
        model: TrainableModel,
        request_id: str,
        items: Sequence[BaseModel],
        step: Step,
        kind: str,
        paths: RunPaths,
        admitted: asyncio.Future[None],
    ) -> StepResultWire:
        try:
            finished = await asyncio.to_thread(finished_step, paths, request_id, self.root)
            if finished is None:
                await asyncio.to_thread(
                    write_text_atomic,
                    paths.dir / "requests" / f"{request_id}.jsonl",
                    "".join(item.model_dump_json() + "\n" for item in items),
                )
        except asyncio.CancelledError:
            admitted.cancel()
            raise
        except BaseException as e:
            admitted.set_exception(e)
            raise
        admitted.set_result(None)
        if finished is not None:
            self.counters["train_replayed"] += 1
            return finished
        self.counters["train_started"] += 1
        lock = self._model_locks.setdefault(model.name, asyncio.Lock())
        async with lock:
            wire = step_result_wire(await step(model), self.root, kind)
            await asyncio.to_thread(
                write_text_atomic,
                paths.dir / "requests" / f"{request_id}.result.json",
                wire.model_dump_json(),
            )
            await self._prune(model, paths)
            return wire

    async def _prune(self, model: TrainableModel, paths: RunPaths) -> None:
        """The retention policy after a step; a failure to prune never fails the step."""
        gateway = self.backend.gateway
        try:
            removed = await asyncio.to_thread(
                apply_retention, paths, self.retention, model.step, self.root / "logs"
            )
            for step in removed.checkpoints:
                await stop_serving(gateway, str(ServedName(model.name, step)))
        except Exception:
            logger.exception("pruning %s failed (the step itself is done)", paths.dir)
            return
        for what, count in removed.counts().items():
            self.counters[f"pruned_{what}"] += count

    async def _events(
        self, request_id: str, task: asyncio.Task[StepResultWire]
    ) -> AsyncIterator[bytes]:
        def line(event: TrainEvent) -> bytes:
            return (event.model_dump_json() + "\n").encode()

        yield line(TrainEvent(event="accepted", request_id=request_id))
        yield line(TrainEvent(event="training", request_id=request_id))
        # asyncio.wait never cancels the task: a client that hangs up leaves the step running.
        while not task.done():
            await asyncio.wait({task}, timeout=self.heartbeat_s)
            if not task.done():
                yield line(TrainEvent(event="heartbeat", request_id=request_id))
        if task.cancelled():
            error: BaseException = EngineError(
                "the step was cancelled: the server is shutting down; nothing of it was kept"
            )
        else:
            error = task.exception()  # type: ignore[assignment]
            if error is None:
                yield line(TrainEvent(event="result", request_id=request_id, result=task.result()))
                return
        # Only an error that says so is worth sending again: anything else (a bug, a
        # deterministic refusal) would fail the same way for the client's whole budget.
        retryable = isinstance(error, RLCoachError) and error.retryable
        self.counters["train_failed"] += 1
        if isinstance(error, RLCoachError):
            logger.error("training request %s failed: %r", request_id, error)
            message = f"{type(error).__name__}: {error}"
        else:
            logger.error("training request %s failed", request_id, exc_info=error)
            message = (
                f"internal error: {type(error).__name__}: {error} (a bug in rlcoach or its "
                "libraries: sending the same request again would fail the same way; the "
                "server's log has the traceback)"
            )
        body = error_body(
            message,
            kind="invalid_request_error"
            if isinstance(error, TrainingDataError | ConfigError)
            else "server_error",
        )
        yield line(
            TrainEvent(
                event="error", request_id=request_id, error=body["error"], retryable=retryable
            )
        )


async def stop_serving(gateway: Gateway | None, served: str) -> None:
    """`served` (a pruned or deleted checkpoint's name) no longer served, nor loaded again
    after an engine crash; nothing to do before the backend started."""
    if gateway is not None:
        await gateway.call(_forget(gateway.router, served))


async def _forget(router: Any, served: str) -> None:
    """`Router.forget` on the gateway's loop, where the router lives."""
    router.forget(served)
