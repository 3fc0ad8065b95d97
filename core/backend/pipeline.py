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

Validation (`Validation`): the served step is scored on held-out data before the first
step and after every `every`-th committed one; the best score's step is kept, the loop
stops once `patience` evaluations in a row brought no new best, and at the end the best
validated checkpoint is served again (`model.restore`, a new step) if a later one scored
lower — so the steps a run adds never leave the model below the best it reached. The
scores are on the returned steps (`PipelineStep.validation`) and on the run
(`PipelineRun.baseline`, `best_step`, `best_score`, `restored_from`). A score is a
number, or a tuple of numbers compared in order (success, then reward to break its
ties, say); with `plateau_stops=False` only a score below the best counts toward
`patience` (a tie neither counts nor resets it), for held-out sets small enough that
equal scores are common and say nothing about a fall.

Resume: indices start at the model's step, which `register` restores from the latest
checkpoint, so a restarted run continues where the last completed step left it (a
skipped step, which trains nothing, leaves the step as it was, so its index comes again).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from rlcoach.errors import ConfigError

if TYPE_CHECKING:
    from rlcoach.backend.local import StepResult
    from rlcoach.model import TrainableModel
    from rlcoach.rollout.teacher import Teacher
    from rlcoach.trajectory.trajectories import TrajectoryGroup

__all__ = ["BatchFn", "PipelineRun", "PipelineStep", "Score", "Validation", "run_pipeline"]

logger = logging.getLogger(__name__)

BatchFn = Callable[[int], Awaitable["list[TrajectoryGroup]"]]
"""Samples the batch for a step index: an async function returning scored groups."""

Score = float | tuple[float, ...]
"""A held-out score, higher is better: a number, or numbers compared in order (the first
decides, the next break its ties)."""


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
    validation: Score | None = None
    """The held-out score of the step this one committed, where it was validated."""

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


@dataclass(frozen=True, slots=True)
class Validation:
    """Held-out evaluation inside the loop: keep the best checkpoint, stop when it falls."""

    evaluate: Callable[[], Awaitable[Score]]
    """The held-out score of the step served now (higher is better): success on a
    held-out split, say, or (success, reward)."""
    every: int = 1
    """Validate after every `every`-th committed step (and after the last one)."""
    patience: int | None = None
    """Stop after this many validations in a row without a new best; None: never early."""
    keep_best: bool = True
    """At the end, serve the best validated checkpoint again if the last scored lower."""
    min_delta: float = 0.0
    """A score must beat the best by more than this to count as a new best (for a tuple:
    its first number; the rest break ties of the first)."""
    plateau_stops: bool = True
    """A score equal to the best (within `min_delta`) counts toward `patience`; False:
    only one below it counts, and a tie neither counts nor resets the count."""


class PipelineRun(list[PipelineStep]):
    """The steps of a run (a list, as before), and what validation found."""

    baseline: Score | None = None
    """The held-out score before the first step."""
    best_step: int | None = None
    """The step with the best held-out score (the model's step before the run, if none
    beat it)."""
    best_score: Score | None = None
    restored_from: int | None = None
    """The checkpoint served again at the end (keep-best), if any."""


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
    validation: Validation | None = None,
    teacher: Teacher | None = None,
) -> PipelineRun:
    """Sample and train batches `model.step` .. `until_step - 1` (see the module
    docstring). `overlap`: None picks the backend's default (`can_overlap`), True
    samples up to `max_staleness` steps ahead, False never ahead. `on_step` is called
    after each step (to log, evaluate, stop early by raising). `validation`: held-out
    scores, keep-best and early stopping (the module docstring). `teacher`: on-policy
    distillation, every batch scored by the teacher before its step (rollout/teacher.py);
    a teacher whose tokenizer differs from the model's is refused before any sampling."""
    if until_step < 0:
        raise ConfigError(f"until_step={until_step} must be >= 0 (the step to train up to)")
    if validation is not None and validation.every < 1:
        raise ConfigError(f"Validation(every={validation.every}) must be >= 1")
    if teacher is not None:
        await asyncio.to_thread(teacher.check, model)
    run = PipelineRun()
    best = _Best(validation, run)
    if validation is not None:
        await best.start(model)
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
    steps = run
    try:
        while (item := await queue.get()) is not None:
            index, sampled_from, rollout_start, rollout_end, groups = item
            trained_from, train_start = model.step, time.perf_counter()
            result, error = None, None
            try:
                result = await model.train(groups, teacher=teacher)
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
            committed = result is not None and result.checkpoint is not None
            due = len(steps) + 1 == until_step - first or (len(steps) + 1) % best.every == 0
            if validation is not None and committed and due:
                step = replace(step, validation=await best.check(model))
            steps.append(step)
            async with progress:
                finished += 1
                progress.notify_all()
            if on_step is not None:
                maybe = on_step(step)
                if maybe is not None:
                    await maybe
            if best.exhausted:
                logger.info("held-out score fell %d times in a row: stopping", best.stale)
                break
    finally:
        if not producer.done():
            producer.cancel()
        await asyncio.gather(producer, return_exceptions=True)
    if producer_error and not isinstance(producer_error[0], asyncio.CancelledError):
        raise producer_error[0]
    if validation is not None:
        await best.finish(model)
    return run


class _Best:
    """The best held-out score seen so far and its step (run_pipeline's validation)."""

    def __init__(self, validation: Validation | None, run: PipelineRun) -> None:
        self.validation = validation
        self.run = run
        self.every = validation.every if validation is not None else 1
        self.stale = 0

    @property
    def exhausted(self) -> bool:
        patience = self.validation.patience if self.validation is not None else None
        return patience is not None and self.stale >= patience

    async def start(self, model: TrainableModel) -> None:
        assert self.validation is not None
        score = await self.validation.evaluate()
        _parts(score)  # a malformed score fails before any step trains
        self.run.baseline = self.run.best_score = score
        self.run.best_step = model.step
        logger.info("held-out score of %s before the run: %s", model.served_name, score)

    async def check(self, model: TrainableModel) -> Score:
        assert self.validation is not None and self.run.best_score is not None
        score = await self.validation.evaluate()
        order = _compare(score, self.run.best_score, self.validation.min_delta)
        if order > 0:
            self.run.best_score, self.run.best_step, self.stale = score, model.step, 0
        elif order < 0 or self.validation.plateau_stops:
            self.stale += 1
        logger.info(
            "held-out score of %s: %s (best %s at step %s)",
            model.served_name,
            score,
            self.run.best_score,
            self.run.best_step,
        )
        return score

    async def finish(self, model: TrainableModel) -> None:
        """Serve the best validated checkpoint again if the last step is not it."""
        assert self.validation is not None
        best = self.run.best_step
        if not self.validation.keep_best or best is None or best == model.step:
            return
        if best == 0:  # the base weights have no checkpoint to restore
            logger.warning(
                "no step beat the base model on held-out data (%s); %s stays served",
                self.run.best_score,
                model.served_name,
            )
            return
        await model.restore(best)
        self.run.restored_from = best
        logger.info("serving checkpoint %d again as %s (best on held-out)", best, model.served_name)


def _compare(score: Score, best: Score, min_delta: float) -> int:
    """1 when `score` beats `best` (its first number by more than `min_delta`, or equal
    within it and the rest higher), -1 when it is below, 0 for a tie."""
    first, rest = _parts(score)
    best_first, best_rest = _parts(best)
    if first > best_first + min_delta:
        return 1
    if first < best_first - min_delta:
        return -1
    return (rest > best_rest) - (rest < best_rest)


def _parts(score: Score) -> tuple[float, tuple[float, ...]]:
    if isinstance(score, tuple):
        if not score:
            raise ConfigError("Validation.evaluate returned an empty tuple; return a number")
        return score[0], score[1:]
    return score, ()
