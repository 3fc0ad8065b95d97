"""Rollout workers: the user's rollout function in a Ray task, its trajectory back.

    rollout = backend.remote(my_rollout)           # async def my_rollout(model, task)
    groups = await gather_trajectory_groups(
        [[rollout(model, task) for _ in range(8)] for task in tasks]
    )

`RayBackend.remote(fn)` returns an async function of the same arguments; each call runs
`fn` in a Ray task wherever the cluster has room, with a `TrainableModel` of the same
name and step whose client talks to the entry point (`EntryClient`), and returns the
trajectory to the driver, which only collects results (core's `gather_trajectory_groups`
bounds concurrency and records failures, as on one host). A rollout whose inference
replica or worker was lost is run again from its start, up to
`RayConfig.max_rollout_attempts` times, and counted (`retried`, and the trajectory's
`ray_retries` metadata): never silently lost.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import httpx

from rlcoach.errors import RolloutError, UsageError
from rlcoach.integrations.ray.actors import ModelSpec, model_from_spec
from rlcoach.trajectory.exchange import Exchange
from rlcoach.trajectory.trajectories import Trajectory

if TYPE_CHECKING:
    from rlcoach.model import TrainableModel
    from rlcoach.paths import RunPaths

__all__ = ["EntryClient", "ReplicaLostError", "run_rollout"]

LOST_STATUS = 410


class ReplicaLostError(RolloutError):
    """The inference replica serving this rollout was lost; run the rollout again."""


class EntryClient:
    """What a `TrainableModel` in a rollout worker needs: the entry point's url and key,
    and its rollouts' exchanges (taken through the entry point from their replica)."""

    def __init__(self, url: str, api_key: str = "rlcoach") -> None:
        self._url = url
        self._key = api_key

    @property
    def url(self) -> str:
        return self._url

    @property
    def api_key(self) -> str:
        return self._key

    async def register(self, model: TrainableModel) -> None:
        return None  # the driver registered it; the worker keeps the step it was given

    async def take_exchanges(self, rollout_id: str) -> list[Exchange]:
        async with httpx.AsyncClient(timeout=60.0) as http:
            response = await http.post(f"{self._url}/rlcoach/rollouts/{rollout_id}")
        if response.status_code == LOST_STATUS:
            raise ReplicaLostError(response.json()["error"]["message"])
        response.raise_for_status()
        return [Exchange.from_wire(e) for e in response.json()["exchanges"]]

    def _driver_only(self, what: str) -> UsageError:
        return UsageError(
            f"{what} runs in the driver, not in a rollout worker; fix: return the "
            "trajectory from the rollout function and call it on the driver's model"
        )

    async def train(self, *args: Any, **kwargs: Any) -> Any:
        raise self._driver_only("model.train")

    def paths(self, model: TrainableModel) -> RunPaths:
        raise self._driver_only("model paths")

    async def delete_checkpoints(self, *args: Any, **kwargs: Any) -> list[int]:
        raise self._driver_only("delete_checkpoints")

    async def close(self) -> None:
        return None


def run_rollout(
    fn: Any, spec: ModelSpec, step: int, url: str, args: tuple, kwargs: dict
) -> Trajectory:
    """The body of a rollout task: the user's `fn(model, *args, **kwargs)` on a model
    whose client talks to the entry point at `url`."""

    async def main() -> Trajectory:
        model = model_from_spec(spec, step)
        await model.register(EntryClient(url))  # type: ignore[arg-type]
        trajectory = await fn(model, *args, **kwargs)
        if not isinstance(trajectory, Trajectory):
            raise UsageError(
                f"the rollout function {getattr(fn, '__name__', fn)!r} returned "
                f"{type(trajectory).__name__}, not a Trajectory; fix: return "
                "`rollout.trajectory` from inside `async with model.rollout() as rollout`"
            )
        return trajectory

    return asyncio.run(main())
