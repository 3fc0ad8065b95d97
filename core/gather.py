"""Running rollouts: bounded concurrency, failures recorded and counted, retries.

`gather_trajectory_groups` takes one iterable of rollout awaitables per group (the
attempts at one task) and runs them all with at most `max_concurrency` in flight, with a
progress bar showing the mean reward and failures. A rollout that raises becomes a
`RolloutFailure` on its group — data, not a crash — unless more than
`max_failure_fraction` of all rollouts failed, in which case the step fails loudly
(`RolloutError`): training on the few survivors would be training on a biased sample.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import traceback
from collections.abc import Awaitable, Callable, Iterable
from typing import ParamSpec, TypeVar

from tqdm.auto import tqdm

from rlcoach.errors import ConfigError, RolloutError, UsageError
from rlcoach.types import RolloutFailure, Trajectory, TrajectoryGroup

__all__ = ["AfterEach", "RolloutFn", "gather_trajectory_groups", "retry"]

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

RolloutFn = Callable[..., Awaitable[Trajectory]]
"""A user's rollout: an async function returning one scored `Trajectory`."""

AfterEach = Callable[[TrajectoryGroup], Awaitable[TrajectoryGroup]]
"""A hook run on each finished group (e.g. a RULER judge); returns the group to keep."""


async def gather_trajectory_groups(
    groups: Iterable[Iterable[Awaitable[Trajectory]]],
    *,
    max_concurrency: int = 32,
    max_failure_fraction: float = 0.5,
    after_each: AfterEach | None = None,
    progress: bool = True,
    description: str = "rollouts",
) -> list[TrajectoryGroup]:
    """Run every rollout, grouped as given; return one `TrajectoryGroup` per group."""
    if max_concurrency < 1:
        raise ConfigError(f"max_concurrency={max_concurrency!r} must be at least 1")
    if not 0.0 <= max_failure_fraction <= 1.0:
        raise ConfigError(f"max_failure_fraction={max_failure_fraction!r} must be in [0, 1]")
    plan = [list(group) for group in groups]
    total = sum(len(group) for group in plan)
    semaphore = asyncio.Semaphore(max_concurrency)
    bar = tqdm(total=total, desc=description, disable=not progress, leave=False)
    rewards: list[float] = []
    failed = 0

    async def run(attempt: Awaitable[Trajectory]) -> Trajectory | RolloutFailure:
        nonlocal failed
        async with semaphore:
            try:
                trajectory = await attempt
                if not isinstance(trajectory, Trajectory):
                    raise UsageError(
                        f"a rollout returned {type(trajectory).__name__}, not a Trajectory; "
                        "fix: return `rollout.trajectory` from the rollout function"
                    )
                rewards.append(trajectory.reward)
                return trajectory
            except Exception as e:
                failed += 1
                logger.warning("rollout failed: %r", e)
                return RolloutFailure(
                    type=type(e).__name__, message=str(e), traceback=traceback.format_exc()
                )
            finally:
                bar.update(1)
                mean = sum(rewards) / len(rewards) if rewards else 0.0
                bar.set_postfix(reward=f"{mean:.3f}", failed=failed)

    async def run_group(attempts: list[Awaitable[Trajectory]]) -> TrajectoryGroup:
        outcomes = await asyncio.gather(*(run(a) for a in attempts))
        group = TrajectoryGroup(
            [o for o in outcomes if isinstance(o, Trajectory)],
            failures=[o for o in outcomes if isinstance(o, RolloutFailure)],
        )
        if after_each is not None:
            group = await after_each(group)
        return group

    try:
        result = await asyncio.gather(*(run_group(g) for g in plan))
    finally:
        bar.close()
    if total and failed / total > max_failure_fraction:
        first = next(f for g in result for f in g.failures)
        raise RolloutError(
            f"{failed} of {total} rollouts failed, above max_failure_fraction="
            f"{max_failure_fraction}; the first failure was {first.type}: {first.message}"
        )
    return list(result)


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
