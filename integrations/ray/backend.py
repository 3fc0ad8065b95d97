"""RayBackend: rlcoach's `Backend` on a Ray cluster.

    backend = RayBackend({"address": "auto", "replicas": 2,
                          "replica": {"num_gpus": 1}, "trainer": {"num_gpus": 1}})
    await model.register(backend)           # replicas, trainer, entry point placed
    rollout = backend.remote(my_rollout)     # the rollout function in Ray tasks
    groups = await gather_trajectory_groups([[rollout(model, t) for _ in range(8)] ...])
    await model.train(groups)                # the trainer actor steps; every replica loads it

What runs where: each inference replica (actors.py: engine + gateway, core's assembly) and
the trainer actor get a placement group of their own (config.py), checked against the
cluster before anything starts (cluster.py). The one OpenAI-compatible entry point
(entry.py) runs in this process: `backend.url`, what `model.openai_client()` talks to
here and in the rollout workers (rollouts.py). A committed step's adapter goes to every
live replica as bytes through the object store; the entry point routes `name@step` only
to replicas that have loaded it.

Faults: a replica lost (its process or node died) is marked by the entry point, its
rollouts in flight are run again elsewhere and counted (`rollouts_retried` and
`replicas_lost` in the next step's metrics), and a new replica is started in a new
placement group as soon as the cluster has room (meanwhile the others serve). A trainer
actor that died is started again and resumes from the last committed step; the step
that was in flight is trained again on the same groups.

Every actor is owned by this process: `close()` (or the end of the process) ends them
and removes their placement groups.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

from rlcoach.backend.local import StepResult
from rlcoach.config import TrainConfig, parse_config
from rlcoach.errors import ConfigError, EngineStartError, TrainerError
from rlcoach.integrations.ray.actors import InferenceReplica, TrainerActor, model_spec
from rlcoach.integrations.ray.cluster import check_room, connect
from rlcoach.integrations.ray.config import RayConfig, Resources
from rlcoach.integrations.ray.entry import EntryPoint, ReplicaState
from rlcoach.integrations.ray.rollouts import EntryClient, ReplicaLostError, run_rollout
from rlcoach.model import TrainableModel
from rlcoach.paths import RunPaths
from rlcoach.trajectory.exchange import Exchange
from rlcoach.trajectory.trajectories import Trajectory, TrajectoryGroup

__all__ = ["RayBackend"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class _Placed:
    """An actor and the placement group that holds it."""

    actor: Any
    group: Any


class RayBackend:
    """Serve and train models on a Ray cluster (see the module)."""

    def __init__(
        self, config: RayConfig | dict[str, Any] | None = None, root: str | Path = ".rlcoach"
    ) -> None:
        self.config = parse_config(RayConfig, config)
        self.root = Path(root).absolute()
        self._ray = connect(self.config.address)
        check_room(self._ray, self.config)
        self.entry: EntryPoint | None = None
        self.replicas: dict[str, _Placed] = {}
        self.trainer: _Placed | None = None
        self.base_model: str | None = None
        self.models: dict[str, TrainableModel] = {}
        self._adapters: dict[str, tuple[int, Any]] = {}  # name -> (step, files' object ref)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._replacing: set[asyncio.Task[None]] = set()
        self.retried = 0
        """Rollouts run again since the last step because their replica or worker was lost."""
        self.lost = 0
        """Replicas lost since the last step."""
        self._client = EntryClient("")

    # -- the Backend protocol ----------------------------------------------------------------

    @property
    def url(self) -> str:
        if self.entry is None:
            raise ConfigError("the Ray backend is not started; register a model first")
        return self.entry.url

    @property
    def api_key(self) -> str:
        return "rlcoach"

    def paths(self, model: TrainableModel) -> RunPaths:
        return RunPaths(self.root, model.project, model.name)

    async def register(self, model: TrainableModel) -> None:
        if self.base_model is None:
            await self._start(model)
        elif model.base_model != self.base_model:
            raise ConfigError(
                f"model {model.name!r} wants base model {model.base_model!r} but this backend "
                f"serves {self.base_model!r}; fix: use one RayBackend per base model"
            )
        assert self.trainer is not None
        spec = model_spec(model)
        model.step = await self.trainer.actor.register.remote(spec)
        self.models[model.name] = model
        assert self.entry is not None
        live = {rid: p for rid, p in self.replicas.items() if p in self._live()}
        await asyncio.gather(*(p.actor.serve_model.remote(model.name) for p in live.values()))
        for rid in live:
            self.entry.loaded(rid, model.name, 0)
        self.entry.publish(model.name, 0)
        step, files = await self.trainer.actor.latest_adapter.remote(model.name)
        if step:
            await self._publish(model.name, step, self._ray.put(files))
        logger.info("registered %s on %d replicas", model.served_name, len(self._live()))

    async def take_exchanges(self, rollout_id: str) -> list[Exchange]:
        return await self._client.take_exchanges(rollout_id)

    async def train(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        config: TrainConfig | dict[str, Any] | None = None,
    ) -> StepResult:
        """One step on the trainer actor; returns once every live replica serves it."""
        if model.name not in self.models or self.trainer is None:
            raise ConfigError(f"model {model.name!r} is not registered with this backend")
        fields = parse_config(TrainConfig, config).model_dump() if config is not None else None
        request_id = uuid.uuid4().hex
        result, files = await self._train_on_actor(model, groups, fields, request_id)
        started = time.perf_counter()
        if files:
            await self._publish(model.name, result.step, self._ray.put(files))
        model.step = result.step
        counts = {
            "rollouts_retried": float(self.retried),
            "replicas_lost": float(self.lost),
            "replicas": float(len(self._live())),
            "fleet_publish_seconds": time.perf_counter() - started,
        }
        self.retried = self.lost = 0
        return dataclasses.replace(result, timings={**result.timings, **counts})

    async def delete_checkpoints(
        self,
        model: TrainableModel,
        best_checkpoint_metric: str = "val/reward",
        *,
        keep_last: int = 1,
        keep_best: int = 1,
        best_mode: Literal["max", "min"] = "max",
    ) -> list[int]:
        raise ConfigError(
            "delete_checkpoints is not offered by RayBackend yet; fix: delete them from "
            "the run folder on the trainer's node with `rlcoach` on one host"
        )

    async def close(self) -> None:
        for task in list(self._replacing):
            task.cancel()
        placed = [*self.replicas.values(), *([self.trainer] if self.trainer else [])]
        for p in placed:
            try:
                await asyncio.wait_for(p.actor.close.remote(), 60)
            except Exception as e:  # a lost actor has nothing left to close
                logger.info("closing a Ray actor: %r", e)
            self._ray.kill(p.actor, no_restart=True)
            self._ray.util.remove_placement_group(p.group)
        self.replicas.clear()
        self.trainer = None
        if self.entry is not None:
            self.entry.stop()
            self.entry = None

    async def __aenter__(self) -> RayBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- rollout workers ---------------------------------------------------------------------

    def remote(self, fn: Callable[..., Awaitable[Trajectory]]) -> Callable[..., Awaitable[Any]]:
        """`fn(model, *args, **kwargs)` run in a Ray task per call (rollouts.py)."""
        task = self._ray.remote(run_rollout).options(
            max_retries=0, **self.config.rollout_worker.options()
        )

        async def run(model: TrainableModel, *args: Any, **kwargs: Any) -> Trajectory:
            spec = model_spec(model)
            for attempt in range(self.config.max_rollout_attempts):
                ref = task.remote(fn, spec, model.step, self.url, args, kwargs)
                try:
                    trajectory: Trajectory = await ref
                except Exception as e:
                    if not self._was_lost(e) or attempt + 1 == self.config.max_rollout_attempts:
                        raise
                    self.retried += 1
                    logger.warning("rollout of %s lost its replica or worker; run again", fn)
                    continue
                trajectory.metadata["ray_retries"] = attempt
                return trajectory
            raise AssertionError("unreachable")

        return run

    def _was_lost(self, error: Exception) -> bool:
        exceptions = self._ray.exceptions
        cause = getattr(error, "cause", None)
        return (
            isinstance(error, ReplicaLostError)
            or isinstance(cause, ReplicaLostError)
            or (
                isinstance(
                    error,
                    exceptions.WorkerCrashedError
                    | exceptions.NodeDiedError
                    | exceptions.ObjectLostError,
                )
            )
        )

    # -- placing the actors ------------------------------------------------------------------

    async def _placed(self, cls: type, resources: Resources, *args: Any) -> _Placed:
        """`cls(*args)` as an actor in a placement group of its own, once the group is ready."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        group = self._ray.util.placement_group([resources.bundle()], strategy=self.config.strategy)
        await group.ready()
        strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)
        actor = (
            self._ray.remote(cls)
            .options(scheduling_strategy=strategy, max_restarts=0, **resources.options())
            .remote(*args)
        )
        return _Placed(actor, group)

    async def _start(self, model: TrainableModel) -> None:
        self._loop = asyncio.get_running_loop()
        host = self.config.entry_host
        everywhere = host in ("0.0.0.0", "::")
        advertised = self._ray.util.get_node_ip_address() if everywhere else host
        self.entry = EntryPoint(host, self._on_lost, advertised=advertised)
        self.entry.start()
        self._client = EntryClient(self.entry.url)
        self.base_model = model.base_model
        timeout = self.config.startup_timeout_s
        try:
            await asyncio.wait_for(self._start_actors(model), timeout)
        except TimeoutError as e:
            await self.close()
            raise EngineStartError(
                f"the Ray cluster did not place and start {self.config.replicas} replicas and "
                f"the trainer within {timeout:.0f} s (RayConfig.startup_timeout_s); fix: "
                "check `ray status` for pending placement groups, or raise the timeout"
            ) from e
        except BaseException:
            await self.close()
            raise

    async def _start_actors(self, model: TrainableModel) -> None:
        engine = self.config.engine.model_dump(mode="json")
        self.trainer = await self._placed(TrainerActor, self.config.trainer, str(self.root), engine)
        started = await asyncio.gather(
            *(self._start_replica(model.base_model) for _ in range(self.config.replicas))
        )
        assert all(started)

    async def _start_replica(self, base_model: str) -> str:
        replica_id = f"r{uuid.uuid4().hex[:8]}"
        engine = self.config.engine.model_dump(mode="json")
        placed = await self._placed(
            InferenceReplica, self.config.replica, replica_id, str(self.root), engine
        )
        info = await placed.actor.start.remote(base_model)
        self.replicas[replica_id] = placed
        state = ReplicaState(replica_id, info["url"])
        # Every model and its latest adapter loaded before the entry point sends it any
        # request; a step published meanwhile is loaded after (the loop's second pass).
        assert self.entry is not None
        while True:
            for name in self.models:
                await placed.actor.serve_model.remote(name)
                state.steps.setdefault(name, {0})
                state.latest.setdefault(name, 0)
            pending = {n: a for n, a in self._adapters.items() if state.latest.get(n) != a[0]}
            if not pending:
                break
            for name, (step, files) in pending.items():
                await placed.actor.publish.remote(name, step, files)
                state.steps.setdefault(name, {0}).add(step)
                state.latest[name] = step
        self.entry.add(state)
        logger.info("inference replica %s serves at %s", replica_id, info["url"])
        return replica_id

    def _live(self) -> list[_Placed]:
        live = {r.replica_id for r in self.entry.live()} if self.entry else set()
        return [p for rid, p in self.replicas.items() if rid in live]

    async def _publish(self, name: str, step: int, files: Any) -> None:
        """Send the adapter to every live replica; a replica that fails it is lost."""
        self._adapters[name] = (step, files)
        assert self.entry is not None
        ids = [rid for rid in self.replicas if rid in {r.replica_id for r in self.entry.live()}]
        outcomes = await asyncio.gather(
            *(self.replicas[rid].actor.publish.remote(name, step, files) for rid in ids),
            return_exceptions=True,
        )
        for rid, outcome in zip(ids, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                logger.warning("replica %s failed to load %s@%d: %r", rid, name, step, outcome)
                self.entry.mark_lost(rid)
            else:
                self.entry.loaded(rid, name, step)
        self.entry.publish(name, step)

    # -- faults ------------------------------------------------------------------------------

    def _on_lost(self, replica_id: str) -> None:
        """The entry point lost a replica (any thread): replace it on the driver's loop."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._schedule_replacement, replica_id)

    def _schedule_replacement(self, replica_id: str) -> None:
        self.lost += 1
        task = asyncio.ensure_future(self._replace(replica_id))
        self._replacing.add(task)
        task.add_done_callback(self._replacing.discard)

    async def _replace(self, replica_id: str) -> None:
        """End the lost replica and start a new one when the cluster has room."""
        placed = self.replicas.pop(replica_id, None)
        if self.entry is not None:
            self.entry.remove(replica_id)
        if placed is not None:
            self._ray.kill(placed.actor, no_restart=True)
            self._ray.util.remove_placement_group(placed.group)
        if self.base_model is None:
            return
        try:
            new = await self._start_replica(self.base_model)
        except Exception as e:
            logger.error("replacing lost replica %s failed: %r", replica_id, e)
            return
        logger.warning("replica %s replaced by %s", replica_id, new)

    async def _train_on_actor(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        fields: dict[str, Any] | None,
        request_id: str,
    ) -> tuple[StepResult, dict[str, bytes]]:
        """The step on the trainer actor; a trainer that died is started again, resumes
        from the last committed step, and trains the same groups once more."""
        assert self.trainer is not None
        try:
            return await self.trainer.actor.train.remote(model.name, groups, fields, request_id)
        except self._ray.exceptions.RayActorError as e:
            logger.warning("the trainer actor died (%r); starting a new one", e)
        self._ray.kill(self.trainer.actor, no_restart=True)
        self._ray.util.remove_placement_group(self.trainer.group)
        engine = self.config.engine.model_dump(mode="json")
        self.trainer = await self._placed(TrainerActor, self.config.trainer, str(self.root), engine)
        for name, registered in self.models.items():
            step = await self.trainer.actor.register.remote(model_spec(registered))
            if name == model.name and step != model.step:
                raise TrainerError(
                    f"the trainer actor died after committing step {step} of {name!r}; "
                    "it is saved and served from the next registration; fix: call "
                    "model.register(backend) again and go on from that step"
                )
        return await self.trainer.actor.train.remote(model.name, groups, fields, request_id)
