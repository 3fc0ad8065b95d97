"""The training loop, synchronous or pipelined: rollouts for step k+1 while step k trains.

    async def batch(index: int) -> list[TrajectoryGroup]:
        return await gather_trajectory_groups(...)   # the rollouts of one step

    steps = await run_pipeline(model, batch, until_step=20)

One loop, two schedules. A producer samples batches one after another (`batch(index)`
for index = the model's step at the start, then +1 ...); a consumer trains each batch
as it arrives (`model.train`, one step at a time). The producer may start batch j once
step j - lag has finished (trained, skipped or failed), where

- lag = 0 (synchronous): a batch is sampled only after the previous step is served, so
  every sample is on-policy. The engine idles while the trainer runs and the other way
  round. The default on a CPU, whose two cores generation and training would share
  (each slowing the other 4-10x), and with a sleeping engine (colocation.py), which
  cannot answer while the trainer has the GPU.
- lag = `TrainConfig.max_staleness` (async, default 1): batch k+1 is sampled by
  version k while step k trains on batch k. The default wherever the backend says the
  engine and the trainer can run at once (`LocalBackend.can_overlap`: on GPUs with the
  engine resident). This is the schedule of PipelineRL, prime-rl's `async_level` and
  AReaL, bounded the same way: batch j is sampled by a version >= j - lag and trained
  from version j, so its staleness never exceeds the bound unless steps fail or skip.

Every sample carries its policy version (`SampledChoice.policy_version`), and the
backend drops trajectories staler than `max_staleness` at the start of each step
(staleness.py), whatever produced them; the ratio of the PPO-clip loss is taken
against the sampler's recorded log-probs, so the off-policy lag is corrected for as far
as clipping allows.

Failures: a step that raises is reported (logged, `PipelineStep.error`, and a `failed`
metrics record whose `batch_file` keeps its batch on disk), and the loop goes on with
the batch sampled meanwhile: nothing sampled is thrown away, and the next step starts
from the latest checkpoint. A batch whose rollouts raise (more than
`max_failure_fraction` failed, say) stops the loop after the step in flight has
finished, and its error propagates.

Resume: indices start at the model's step, which `register` restores from the latest
checkpoint, so a restarted run continues where the last completed step left it (a
skipped step, which trains nothing, leaves the step as it was, so its index comes again).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlcoach.errors import ConfigError

if TYPE_CHECKING:
    from rlcoach.backend.local import StepResult
    from rlcoach.model import TrainableModel
    from rlcoach.trajectory.trajectories import TrajectoryGroup

__all__ = ["BatchFn", "PipelineStep", "run_pipeline"]

logger = logging.getLogger(__name__)

BatchFn = Callable[[int], Awaitable["list[TrajectoryGroup]"]]
"""Samples the batch for a step index: an async function returning scored groups."""


@dataclass(frozen=True, slots=True)
class PipelineStep:
    """One step of the loop: its batch, its timings, and what training did with it."""

    index: int
    """The batch index passed to the batch function."""
    sampled_from: int
    """The model's step (policy version) when the batch began sampling."""
    trained_from: int
    """The model's step when the batch began training."""
    result: StepResult | None
    """What the step did; None when it failed."""
    error: str | None
    """`Type: message` of the step's error; None when it did not fail."""
    rollout_start: float
    rollout_end: float
    train_start: float
    train_end: float
    """`time.perf_counter()` marks: when the batch's rollouts ran and its step trained
    (a timeline of the loop: the trainer waited from the previous `train_end` to this
    `train_start`)."""

    @property
    def lag(self) -> int:
        """Versions between sampling and training (the pipeline's staleness)."""
        return self.trained_from - self.sampled_from

    def as_dict(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__slots__ if name != "result"}
        data["rollout_seconds"] = self.rollout_end - self.rollout_start
        data["train_seconds"] = self.train_end - self.train_start
        if self.result is not None:
            data.update(self.result.as_dict())
        return data


def resolve_overlap(model: TrainableModel, overlap: bool | None) -> int:
    """The producer's lag: 0 without overlap, else the model's `max_staleness`."""
    if overlap is None:
        overlap = bool(getattr(model.backend, "can_overlap", False))
    if not overlap:
        return 0
    lag = model.config.max_staleness
    if lag == 0:
        logger.info("max_staleness=0: rollouts cannot overlap training; running synchronously")
    return lag


async def run_pipeline(
    model: TrainableModel,
    batch: BatchFn,
    until_step: int,
    *,
    overlap: bool | None = None,
    on_step: Callable[[PipelineStep], Awaitable[None] | None] | None = None,
) -> list[PipelineStep]:
    """Sample and train batches `model.step` .. `until_step - 1` (see the module
    docstring). `overlap`: None picks the backend's default (`can_overlap`), True
    samples up to `max_staleness` steps ahead, False never ahead. `on_step` is called
    after each step (to log, evaluate, stop early by raising)."""
    if until_step < 0:
        raise ConfigError(f"until_step={until_step} must be >= 0 (the step to train up to)")
    lag = resolve_overlap(model, overlap)
    first = model.step
    finished = 0
    progress = asyncio.Condition()
    queue: asyncio.Queue[tuple[int, int, float, float, list[TrajectoryGroup]] | None]
    queue = asyncio.Queue()
    producer_error: list[BaseException] = []

    async def produce() -> None:
        try:
            for j, index in enumerate(range(first, until_step)):
                async with progress:
                    await progress.wait_for(lambda j=j: finished >= j - lag)  # type: ignore[misc]  # mypy cannot type a default-bound lambda
                sampled_from = model.step
                started = time.perf_counter()
                groups = await batch(index)
                await queue.put((index, sampled_from, started, time.perf_counter(), groups))
        except BaseException as e:
            producer_error.append(e)
            raise
        finally:
            queue.put_nowait(None)

    producer = asyncio.create_task(produce(), name=f"rlcoach-rollouts-{model.name}")
    steps: list[PipelineStep] = []
    try:
        while (item := await queue.get()) is not None:
            index, sampled_from, rollout_start, rollout_end, groups = item
            trained_from, train_start = model.step, time.perf_counter()
            result, error = None, None
            try:
                result = await model.train(groups)
            except Exception as e:  # reported; the loop goes on with the next batch
                error = f"{type(e).__name__}: {e}"
                logger.error("step from %s (batch %d) failed: %s", trained_from, index, error)
            step = PipelineStep(
                index,
                sampled_from,
                trained_from,
                result,
                error,
                rollout_start,
                rollout_end,
                train_start,
                time.perf_counter(),
            )
            steps.append(step)
            async with progress:
                finished += 1
                progress.notify_all()
            if on_step is not None:
                maybe = on_step(step)
                if maybe is not None:
                    await maybe
    finally:
        if not producer.done():
            producer.cancel()
        await asyncio.gather(producer, return_exceptions=True)
    if producer_error and not isinstance(producer_error[0], asyncio.CancelledError):
        raise producer_error[0]
    return steps
