"""Gathering: failures become data, too many of them fail the step loudly."""

import asyncio

import pytest

from rlcoach import RolloutError, Trajectory, gather_trajectory_groups, retry


async def _ok(reward: float) -> Trajectory:
    await asyncio.sleep(0)
    return Trajectory(reward=reward)


async def _boom() -> Trajectory:
    raise RuntimeError("tool server down")


async def test_failures_are_recorded_and_counted():
    groups = await gather_trajectory_groups(
        [[_ok(1.0), _boom(), _ok(0.0)], [_ok(0.5)]], progress=False
    )
    assert [g.rewards for g in groups] == [[1.0, 0.0], [0.5]]
    assert len(groups[0].failures) == 1
    failure = groups[0].failures[0]
    assert failure.type == "RuntimeError"
    assert failure.message == "tool server down"
    assert "_boom" in failure.traceback


async def test_too_many_failures_fail_loudly():
    with pytest.raises(RolloutError, match=r"2 of 3 rollouts failed.*tool server down"):
        await gather_trajectory_groups(
            [[_boom(), _boom(), _ok(1.0)]], progress=False, max_failure_fraction=0.5
        )


async def test_concurrency_is_bounded():
    running = peak = 0

    async def tracked() -> Trajectory:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        return Trajectory()

    await gather_trajectory_groups(
        [[tracked() for _ in range(10)]], max_concurrency=3, progress=False
    )
    assert peak == 3


async def test_after_each_replaces_the_group():
    async def double(group):
        for t in group.trajectories:
            t.reward *= 2
        return group

    groups = await gather_trajectory_groups([[_ok(0.25)]], after_each=double, progress=False)
    assert groups[0].rewards == [0.5]


async def test_a_rollout_returning_the_wrong_type_is_a_failure():
    async def wrong():
        return {"reward": 1}

    groups = await gather_trajectory_groups([[wrong(), _ok(1.0)]], progress=False)
    assert "not a Trajectory" in groups[0].failures[0].message


async def test_retry_retries_then_raises():
    calls = 0

    @retry(attempts=3, delay_s=0.001)
    async def flaky() -> int:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionError("reset")
        return calls

    assert await flaky() == 3

    @retry(attempts=2, delay_s=0.001, exceptions=(ConnectionError,))
    async def broken() -> None:
        raise ConnectionError("always")

    with pytest.raises(ConnectionError):
        await broken()
