"""Running rollouts: bounded concurrency, failures recorded and counted, retries.

`gather_trajectory_groups` takes one entry per group (the attempts at one task) and runs
every rollout with at most `max_concurrency` in flight, with a progress bar showing the
mean reward and failures. An entry is an iterable of rollout awaitables, or — as ART
writes it — a pending `TrajectoryGroup(rollout(...) for _ in range(n))`, or any awaitable
that returns a finished group. A rollout that raises becomes a `RolloutFailure` on its
group — data, not a crash — unless more than `max_failure_fraction` of all rollouts
failed (or more than ART's `max_exceptions`: a count, or a fraction below 1), in which
case the step fails loudly (`RolloutError`): training on the few survivors would be
training on a biased sample. `gather_trajectories` is the same for rollouts without
groups (ART's function of that name).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, ParamSpec, TypeVar

from tqdm.auto import tqdm

from rlcoach.errors import ConfigError, RolloutError, UsageError
from rlcoach.trajectory.trajectories import (
    RolloutFailure,
    Trajectory,
    TrajectoryGroup,
    failure_from_exception,
)

__all__ = [
    "AfterEach",
    "GroupEntry",
    "RolloutFn",
    "gather_trajectories",
    "gather_trajectory_groups",
    "retry",
]

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

RolloutFn = Callable[..., Awaitable[Trajectory]]
"""A user's rollout: an async function returning one scored `Trajectory`."""

AfterEach = Callable[[TrajectoryGroup], Awaitable[TrajectoryGroup | list[TrajectoryGroup] | None]]
"""A hook run on each finished group (e.g. a RULER judge); returns the group to keep
(or, as in ART, None to drop it, or a list of groups)."""

GroupEntry = Iterable[Awaitable[Trajectory]] | TrajectoryGroup | Awaitable[TrajectoryGroup]
"""One group for `gather_trajectory_groups`: its rollouts, a pending `TrajectoryGroup`,
or an awaitable that returns a finished group."""


def _allowed_failures(
    total: int, max_failure_fraction: float, max_exceptions: int | float | None
) -> float:
    """How many failed rollouts a gather tolerates."""
    if max_exceptions is None:
        if not 0.0 <= max_failure_fraction <= 1.0:
            raise ConfigError(
                f"max_failure_fraction={max_failure_fraction!r} must be in [0, 1]; fix: "
                "pass e.g. 0.5 (at most half the rollouts may fail)"
            )
        return max_failure_fraction * total
    if isinstance(max_exceptions, bool) or max_exceptions < 0:
        raise ConfigError(
            f"max_exceptions={max_exceptions!r} must be a count (0, 1, 2, ...) or a fraction "
            "below 1; fix: pass e.g. max_exceptions=4 or max_exceptions=0.1"
        )
    return max_exceptions * total if 0 < max_exceptions < 1 else float(max_exceptions)


class _Progress:
    """The progress bar and the numbers it shows."""

    def __init__(self, total: int, description: str, enabled: bool) -> None:
        self.bar = tqdm(total=total, desc=description, disable=not enabled, leave=False)
        self.rewards: list[float] = []
        self.failed = 0

    def done(self, outcome: Trajectory | RolloutFailure) -> None:
        if isinstance(outcome, Trajectory):
            self.rewards.append(outcome.reward)
        else:
            self.failed += 1
        self.bar.update(1)
        mean = sum(self.rewards) / len(self.rewards) if self.rewards else 0.0
        self.bar.set_postfix(reward=f"{mean:.3f}", failed=self.failed)


def _plan(entry: Any) -> tuple[TrajectoryGroup | None, list[Awaitable[Any]]]:
    """(the group so far, the awaitables still to run) of one entry."""
    if isinstance(entry, TrajectoryGroup):
        return entry.split_pending()
    if inspect.isawaitable(entry):
        return None, [entry]
    if isinstance(entry, Iterable) and not isinstance(entry, str | bytes | dict):
        return TrajectoryGroup(), list(entry)
    raise ConfigError(
        f"a group given to gather_trajectory_groups is {type(entry).__name__}, not rollouts; "
        "fix: pass one iterable of rollout coroutines per group, e.g. "
        "[[rollout(task) for _ in range(8)] for task in tasks], or "
        "TrajectoryGroup(rollout(task) for _ in range(8)) per task"
    )


async def gather_trajectory_groups(
    groups: Iterable[GroupEntry],
    *,
    max_concurrency: int = 32,
    max_failure_fraction: float = 0.5,
    max_exceptions: int | float | None = None,
    after_each: AfterEach | None = None,
    progress: bool = True,
    description: str = "rollouts",
    pbar_desc: str | None = None,
) -> list[TrajectoryGroup]:
    """Run every rollout, grouped as given; return one `TrajectoryGroup` per group.

    `max_exceptions` (ART's name) replaces `max_failure_fraction` when given: at most that
    many failed rollouts, or that fraction of them when below 1. `pbar_desc` is ART's name
    for `description`."""
    if max_concurrency < 1:
        raise ConfigError(f"max_concurrency={max_concurrency!r} must be at least 1")
    plans = [_plan(entry) for entry in groups]
    total = sum(len(attempts) for _, attempts in plans)
    allowed = _allowed_failures(total, max_failure_fraction, max_exceptions)
    semaphore = asyncio.Semaphore(max_concurrency)
    shown = _Progress(total, pbar_desc or description, progress)

    async def run(attempt: Awaitable[Any], whole_group: bool) -> Any:
        async with semaphore:
            try:
                outcome = await attempt
                wanted = TrajectoryGroup if whole_group else Trajectory
                if not isinstance(outcome, wanted):
                    raise UsageError(
                        f"a rollout returned {type(outcome).__name__}, not a "
                        f"{wanted.__name__}; fix: return `rollout.trajectory` (or the "
                        "Trajectory you built) from the rollout function"
                    )
            except Exception as e:
                logger.warning("rollout failed: %r", e)
                outcome = failure_from_exception(e)
            if isinstance(outcome, TrajectoryGroup):
                for trajectory in outcome.trajectories:
                    shown.done(trajectory)
            else:
                shown.done(outcome)
            return outcome

    async def run_group(
        base: TrajectoryGroup | None, attempts: list[Awaitable[Any]]
    ) -> list[TrajectoryGroup]:
        outcomes = await asyncio.gather(*(run(a, base is None) for a in attempts))
        if base is None:  # an awaitable that returns a whole group
            (outcome,) = outcomes
            group = outcome if isinstance(outcome, TrajectoryGroup) else None
            group = group or TrajectoryGroup(failures=[outcome])
        else:
            group = base.model_copy(
                update={
                    "trajectories": [
                        *base.trajectories,
                        *(o for o in outcomes if isinstance(o, Trajectory)),
                    ],
                    "failures": [
                        *base.failures,
                        *(o for o in outcomes if isinstance(o, RolloutFailure)),
                    ],
                }
            )
        if after_each is None:
            return [group]
        kept = await after_each(group)
        if kept is None:
            return []
        return list(kept) if isinstance(kept, list) else [kept]

    try:
        result = await asyncio.gather(*(run_group(b, a) for b, a in plans))
    finally:
        shown.bar.close()
    if shown.failed > allowed:
        failures = [f for part in result for group in part for f in group.failures]
        first = failures[0] if failures else RolloutFailure(type="?", message="(dropped)")
        limit = (
            f"max_exceptions={max_exceptions}"
            if max_exceptions is not None
            else f"max_failure_fraction={max_failure_fraction}"
        )
        raise RolloutError(
            f"{shown.failed} of {total} rollouts failed, above {limit}; the first failure "
            f"was {first.type}: {first.message}"
        )
    return [group for part in result for group in part]


async def gather_trajectories(
    trajectories: Iterable[Awaitable[Trajectory]] | Iterable[Awaitable[Iterable[Trajectory]]],
    *,
    max_concurrency: int = 32,
    max_exceptions: int | float = 0,
    progress: bool = True,
    pbar_desc: str = "rollouts",
) -> list[Any]:
    """Run rollouts that are not grouped (ART's `gather_trajectories`), in input order.

    Each result is a `Trajectory` (or a list of them, for an awaitable that returns
    several). With `max_exceptions=0` the first failure is raised; above it, failed
    rollouts come back as their exception until more than `max_exceptions` failed."""
    attempts = list(trajectories)
    allowed = _allowed_failures(len(attempts), 0.0, max_exceptions)
    semaphore = asyncio.Semaphore(max_concurrency)
    shown = _Progress(len(attempts), pbar_desc, progress)

    async def run(attempt: Awaitable[Any]) -> Any:
        async with semaphore:
            try:
                outcome = await attempt
            except Exception as e:
                shown.done(failure_from_exception(e))
                if shown.failed > allowed:
                    raise
                logger.warning("rollout failed: %r", e)
                return e
            for trajectory in [outcome] if isinstance(outcome, Trajectory) else outcome:
                shown.done(trajectory)
            return outcome if isinstance(outcome, Trajectory) else list(outcome)

    try:
        return list(await asyncio.gather(*(run(a) for a in attempts)))
    finally:
        shown.bar.close()


def retry(
    attempts: int = 3,
    delay_s: float = 0.5,
    backoff: float = 2.0,
    exceptions: tuple[type[BaseException], ...] = (Exception,),
) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[T]]]:
    """Retry an async function on `exceptions`, with exponential backoff and jitter."""
    if attempts < 1:
        raise ConfigError(f"retry attempts={attempts!r} must be at least 1")

    def decorate(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
        @functools.wraps(fn)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            wait = delay_s
            for attempt in range(1, attempts + 1):
                try:
                    return await fn(*args, **kwargs)
                except exceptions as e:
                    if attempt == attempts:
                        raise
                    logger.info(
                        "%s failed (%r); retry %d of %d in %.1f s",
                        fn.__name__,
                        e,
                        attempt,
                        attempts - 1,
                        wait,
                    )
                    await asyncio.sleep(wait * (0.5 + random.random()))
                    wait *= backoff
            raise AssertionError("unreachable")

        return wrapper

    return decorate
