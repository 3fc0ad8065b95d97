"""LocalBackend: the policy endpoint and the trainer on this machine.

`register(model)` resolves the base model, starts the engine (vLLM subprocess or the
in-process transformers engine) and the gateway in front of it, and resumes the model
from its latest complete checkpoint. `train(model, groups)` saves the groups beside the
checkpoints first (so a crash mid-step loses no trajectory), runs one LoRA step in a
worker thread, and commits it (step_commit.py: the adapter renamed into
`<root>/<project>/<model>/checkpoints/<step>/`, published to the engine while the
optimizer state is written beside it, its metrics record kept in the folder, the commit
point; any failure before it rolls the whole step back), then bumps the model's step.
Before training, samples staler than `TrainConfig.max_staleness` policy versions are
dropped and counted (staleness.py). Rollouts may run while a step trains (the async
pipeline, pipeline.py; the default where `can_overlap`, on GPUs); on a CPU the loop
stays synchronous. With `EngineConfig(colocation="sleep")` the engine sleeps while the
trainer runs (colocation.py). A step that raises keeps its batch on disk, is recorded as
`failed`, and makes the next step rebuild the trainer from the latest checkpoint. On a
GPU, registration first checks that the engine and the trainer fit (memory.py).

The trainer is a `Trainer` (trainer/base.py): `LoraTrainer` in this process, or, where
the placement names several training GPUs (or `cpu_train_ranks` asks for CPU ranks),
`DistributedTrainer`: torchrun ranks under FSDP2 (trainer/distributed.py), its workers'
log under `<root>/logs/`. Ranks that died are replaced at the next step from the latest
checkpoint.

`Backend` is the protocol a `TrainableModel` needs from any backend; `RemoteBackend`
(remote.py) implements it over HTTP against `rlcoach serve`, so user code switches
between the two by one line. A step trained for a request id (the server passes the
client's) records that id inside its checkpoint folder, so a retried request is
recognised as done once the step has committed, even if the server died right after.

Each registered model gets a `SinkSet` (sinks.py): the disk record (trajectories before
the step, a line of `metrics.jsonl` after its commit, written again from the checkpoint
at registration if a crash lost it) and the plug-ins the `sinks` config names
or the environment asks for (Langfuse, W&B), which never block or fail a step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from rlcoach.backend.colocation import (
    check_sleep_mode,
    release_gpu_cache,
    sleep_engine,
    wake_engine,
)
from rlcoach.backend.step_commit import (
    STEP_RECORD,
    MetricsLedger,
    StepResult,
    TrainedStep,
    commit_step,
    matches_checkpoint,
    set_aside,
)
from rlcoach.backend.supervisor import EngineSupervisor, RestartableEngine
from rlcoach.backend.training_input import (
    TrainingLimits,
    check_examples,
    check_groups,
    training_limits,
)
from rlcoach.config import EngineConfig, SFTConfig, TrainConfig, parse_config
from rlcoach.endpoint.gateway import Gateway, Recorder
from rlcoach.endpoint.router import Router
from rlcoach.engines.base import Engine
from rlcoach.errors import ConfigError, TrainerError
from rlcoach.models.base_model import resolve_base_model, served_base_name
from rlcoach.models.bundled import BUNDLED_MODEL
from rlcoach.models.families import fallback_chat_template
from rlcoach.models.served_name import ServedName
from rlcoach.observe.sinks import (
    Sink,
    SinkConfig,
    SinkSet,
    open_sinks,
    resolve_sinks,
    run_info,
)
from rlcoach.paths import (
    DEFAULT_ROOT,
    RunPaths,
    write_text_atomic,
)
from rlcoach.rollout.staleness import Staleness, drop_stale
from rlcoach.runtime.failpoints import failpoint
from rlcoach.runtime.heap import after_step
from rlcoach.trainer.base import SFTStats, Trainer
from rlcoach.trainer.pool import TrainerPool
from rlcoach.trajectory.trajectories import ChatRecord, Trajectory, TrajectoryGroup

if TYPE_CHECKING:
    from rlcoach.model import TrainableModel
    from rlcoach.runtime.placement import Placement

__all__ = [
    "STEP_RECORD",
    "Backend",
    "LocalBackend",
    "StepResult",
    "resolve_base_model",
    "served_base_name",
]

logger = logging.getLogger(__name__)


@runtime_checkable
class Backend(Protocol):
    """What a `TrainableModel` needs from a backend: local (`LocalBackend`) or remote."""

    @property
    def url(self) -> str:
        """Base URL of the policy endpoint (OpenAI-compatible under `/v1`)."""

    @property
    def api_key(self) -> str:
        """The key to send to the policy endpoint."""

    async def register(self, model: TrainableModel) -> None:
        """Serve `model` (resuming from its latest checkpoint) and set `model.step`."""

    async def train(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        config: TrainConfig | dict[str, Any] | None = None,
    ) -> StepResult:
        """One step on `groups`; returns once the new adapter is served."""

    async def take_exchanges(self, rollout_id: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """The exchanges recorded for a rollout id (each returned once)."""

    def paths(self, model: TrainableModel) -> RunPaths:
        """Folders for the model's files on the machine that runs the user code."""

    async def delete_checkpoints(
        self,
        model: TrainableModel,
        best_checkpoint_metric: str = "val/reward",
        *,
        keep_last: int = 1,
        keep_best: int = 1,
        best_mode: Literal["max", "min"] = "max",
    ) -> list[int]:
        """Delete the model's old checkpoints but the latest, the `keep_last` newest and
        the `keep_best` best by the metric (evaluation.py); return the deleted steps."""

    async def close(self) -> None:
        """Release what the backend holds (engine, connections)."""


class LocalBackend:
    """Serve and train models on this machine."""

    def __init__(
        self,
        root: str | os.PathLike[str] = DEFAULT_ROOT,
        engine: EngineConfig | dict[str, Any] | None = None,
        sinks: SinkConfig | dict[str, Any] | list[str | Sink] | None = None,
        max_trainers: int = 2,
        step_wait_timeout_s: float = 3600.0,
        *,
        path: str | os.PathLike[str] | None = None,
        in_process: bool | None = None,
    ) -> None:
        """`sinks`: plug-in sinks by name (`["wandb"]`), `Sink` objects, or a `SinkConfig`
        (dict form accepted); Langfuse turns on by itself when its keys are set.
        `max_trainers`: trainers kept in memory (each holds a copy of the base model).
        `step_wait_timeout_s`: the longest a step waits for its model's previous step or
        for a trainer slot (then a retryable `TrainerError`).
        `path` is ART's name for `root`; `in_process` is accepted for ART's sake (the
        trainer always runs in this process, vLLM always in its own)."""
        if path is not None:
            if Path(root) != DEFAULT_ROOT and Path(root) != Path(path):
                raise ConfigError(
                    f"root={str(root)!r} and path={str(path)!r} name the run folder twice; "
                    "fix: give one of them"
                )
            root = path
        if in_process is not None:
            logger.info("LocalBackend(in_process=%s) has no effect in rlcoach", in_process)
        if max_trainers < 1:
            raise ConfigError(
                f"max_trainers={max_trainers}: at least one trainer is needed; "
                "fix: pass max_trainers >= 1"
            )
        self.max_trainers = max_trainers
        # Absolute, because the vLLM server resolves adapter paths from its own cwd.
        self.root = Path(root).absolute()
        self.engine_config = parse_config(EngineConfig, engine)
        self.engine: Engine | None = None
        self.gateway: Gateway | None = None
        self.base_model: str | None = None
        self._model_path: Path | None = None
        self.step_wait_timeout_s = step_wait_timeout_s
        self._pool = TrainerPool(max_trainers, wait_timeout_s=step_wait_timeout_s)
        self._step_locks: dict[str, asyncio.Lock] = {}
        self._tokenizer_cache: Any = None
        self._limits: TrainingLimits | None = None
        self._models: dict[str, TrainableModel] = {}
        self.sink_config, self._sink_objects = resolve_sinks(sinks)
        self._sinks: dict[str, SinkSet] = {}
        self._ledgers: dict[str, MetricsLedger] = {}
        self.supervisor: EngineSupervisor | None = None
        self._supervision: Any = None

    @property
    def api_key(self) -> str:
        return "rlcoach"  # the local gateway checks no key

    @property
    def url(self) -> str:
        if self.gateway is None:
            raise ConfigError("the backend is not started; register a model first")
        return self.gateway.url

    async def __aenter__(self) -> LocalBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __enter__(self) -> LocalBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        # ART opens its backend with a plain `with` inside async code, where `close()`
        # cannot be awaited: it runs on an event loop of its own in a helper thread.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, self.close()).result()

    async def start(self, base_model: str = BUNDLED_MODEL) -> None:
        """Start the engine and the gateway now (`register` does it on first use)."""
        if self.gateway is None:
            await self._start(base_model, TrainConfig())

    @property
    def can_overlap(self) -> bool:
        """Whether rollouts can run while a step trains without slowing each other down:
        on GPUs with the engine resident (not on a CPU, whose cores both would share, nor
        with a sleeping engine). The async pipeline's default (pipeline.py)."""
        return self._placement() is not None and self.engine_config.colocation != "sleep"

    def _make_engine(self, model_path: Path, base_name: str) -> Engine:
        """The engine `EngineConfig.kind` names (the one seam tests put a stand-in into)."""
        c = self.engine_config
        if c.kind == "vllm":
            from rlcoach.engines.vllm import VLLMEngine

            log = self.root / "logs" / f"vllm-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
            return VLLMEngine(model_path, base_name, c, log)
        if c.kind == "transformers-process":
            from rlcoach.engines.transformers_process import TransformersProcessEngine

            log = self.root / "logs" / f"engine-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
            return TransformersProcessEngine(model_path, base_name, c, log)
        from rlcoach.engines.transformers import TransformersEngine

        template = (
            c.chat_template.read_text() if c.chat_template else fallback_chat_template(model_path)
        )
        return TransformersEngine(
            model_path,
            base_name,
            chat_template=template,
            max_model_len=c.max_model_len,
            dtype=c.dtype,
        )

    async def _start(
        self,
        base_model: str,
        train_config: TrainConfig,
        engine_overrides: Mapping[str, Any] | None = None,
    ) -> None:
        """Start the engine for `base_model`: `train_config` sizes the GPU memory check,
        `engine_overrides` (a model's `EngineConfig` fields, from ART's `_internal_config`)
        are applied to this backend's engine config first."""
        self._model_path = await asyncio.to_thread(resolve_base_model, base_model)
        if engine_overrides:
            fields = {**self.engine_config.model_dump(), **engine_overrides}
            fields["extra_args"] = [
                *self.engine_config.extra_args,
                *engine_overrides.get("extra_args", []),
            ]
            self.engine_config = parse_config(EngineConfig, fields)
        c = self.engine_config
        base_name = served_base_name(base_model)
        engine = self._make_engine(self._model_path, base_name)
        placement = getattr(engine, "placement", None)
        resolved = placement() if callable(placement) else None
        if resolved is not None:
            from rlcoach.runtime.memory import check_gpu_memory

            await asyncio.to_thread(check_gpu_memory, self._model_path, c, train_config, resolved)
        if c.colocation == "sleep":
            gpus = (resolved.serve_gpus, resolved.train_gpus) if resolved else ((), ())
            check_sleep_mode(engine, *gpus)
        recorder = Recorder(c.max_recorded_rollouts, ttl_s=c.recording_ttl_s)
        router = Router(engine, c.max_loras, wait_timeout_s=c.adapter_wait_timeout_s)
        gateway = Gateway(engine, router, c.host, c.port, recorder=recorder)
        gateway.start()
        try:
            await gateway.call(engine.start(), timeout_s=c.startup_timeout_s + 60)
        except BaseException:
            await gateway.call(engine.close(), timeout_s=120)
            gateway.stop()
            raise
        self.engine, self.gateway, self.base_model = engine, gateway, base_model
        if isinstance(engine, RestartableEngine):
            self.supervisor = EngineSupervisor(engine, gateway.router)
            self._supervision = gateway.submit(self.supervisor.run())

    async def register(self, model: TrainableModel) -> None:
        if self.gateway is None:
            await self._start(model.base_model, model.config, model.engine_overrides)
        elif model.engine_overrides:
            logger.warning(
                "model %s asks for engine settings %s, but the engine already runs; they "
                "apply only to the model that starts it",
                model.name,
                model.engine_overrides,
            )
        if model.base_model != self.base_model:
            raise ConfigError(
                f"model {model.name!r} wants base model {model.base_model!r} but this backend "
                f"serves {self.base_model!r}; fix: use one LocalBackend per base model"
            )
        assert self.gateway is not None
        paths = self.paths(model)
        self._check_lora_rank(model, paths)
        step_lock = self._step_locks.get(model.name)
        if step_lock is None or not step_lock.locked():  # else its step owns that folder
            for removed in await asyncio.to_thread(paths.remove_partial_checkpoints):
                logger.warning("removed a partial checkpoint left by a crash: %s", removed)
        latest = paths.latest_checkpoint()
        steps = paths.complete_checkpoints()
        model.step = latest[0] if latest else 0
        self.gateway.router.register(model.name, 0, steps)
        if latest is not None:
            await self.gateway.call(self.gateway.router.publish(model.name, *latest))
            logger.info("resumed %s from %s", model.served_name, latest[1])
        self._models[model.name] = model
        if model.name not in self._sinks:
            if self._sink_objects and self._sinks:
                raise ConfigError(
                    f"model {model.name!r} is the second model of a backend given Sink "
                    "objects, and a Sink object records one run; fix: pass plug-in names "
                    "(each model gets its own sinks) or use one LocalBackend per model"
                )
            info = run_info(
                self.root,
                model.project,
                model.name,
                model.base_model,
                model.config.model_dump(mode="json"),
            )
            self._sinks[model.name] = await asyncio.to_thread(
                open_sinks, info, self.sink_config, self._sink_objects
            )
        ledger = self._ledgers.get(model.name)
        if ledger is None:
            ledger = MetricsLedger(paths, self._sinks[model.name].write_metrics_record)
            self._ledgers[model.name] = ledger
        # A crash between a step's commit and its metrics line left the line out.
        if written := await asyncio.to_thread(ledger.sync, True):
            logger.warning(
                "metrics.jsonl of %s lacked the lines of committed steps %s (a crash after "
                "their commit); written from their checkpoints",
                model.name,
                written,
            )

    def _check_lora_rank(self, model: TrainableModel, paths: RunPaths) -> None:
        """Refuse a model whose adapters the engine would refuse at every publish."""
        limit = self.engine_config.max_lora_rank
        if self.engine_config.kind == "transformers":
            return  # the in-process engine serves any rank
        problem = None
        if model.config.lora.rank > limit:
            problem = f"trains a LoRA of rank {model.config.lora.rank}"
        elif (latest := paths.latest_checkpoint()) is not None:
            try:
                rank = int(json.loads((latest[1] / "adapter_config.json").read_text())["r"])
            except (OSError, ValueError, KeyError, TypeError):
                rank = 0  # unreadable: loading it will say why
            if rank > limit:
                problem = f"resumes from checkpoint {latest[1]}, a LoRA of rank {rank}"
        if problem is not None:
            raise ConfigError(
                f"model {model.name!r} {problem}, but the engine serves adapters up to rank "
                f"{limit} (EngineConfig.max_lora_rank), so every publish would fail; fix: "
                "start the engine with a max_lora_rank at least that large "
                "(`rlcoach serve --max-lora-rank`), or train a smaller rank under a new name"
            )

    def training_limits(self) -> TrainingLimits:
        """The vocabulary and context that training input must fit (training_input.py)."""
        if self._limits is None:
            if self._model_path is None:
                raise ConfigError("the backend is not started; register a model first")
            self._limits = training_limits(self._model_path, self.engine_config.max_model_len)
        return self._limits

    def sinks(self, model: TrainableModel) -> SinkSet:
        """The sinks recording `model`'s run (the disk record and the plug-ins)."""
        if model.name not in self._sinks:
            raise ConfigError(f"model {model.name!r} is not registered with this backend")
        return self._sinks[model.name]

    def paths(self, model: TrainableModel) -> RunPaths:
        return RunPaths(self.root, model.project, model.name)

    async def take_exchanges(self, rollout_id: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        if self.gateway is None:
            return []
        return self.gateway.recorder.take(rollout_id)

    def _placement(self) -> Placement | None:
        """The engine's GPU placement (None on a CPU or for an engine without one)."""
        placement = getattr(self.engine, "placement", None)
        return placement() if callable(placement) else None

    def _train_device(self) -> str | None:
        """The trainer's GPU from the engine's placement (None: the trainer's default)."""
        resolved = self._placement()
        return resolved.train_device() if resolved is not None else None

    def _train_ranks(self) -> int:
        """How many ranks train: the training GPUs, or the CPU ranks asked for (1: one
        process, `LoraTrainer`)."""
        resolved = self._placement()
        if resolved is not None:
            return len(resolved.train_gpus)
        return max(self.engine_config.placement.cpu_train_ranks, 1)

    def _make_trainer(self, model: TrainableModel) -> Trainer:
        assert self._model_path is not None
        ranks = self._train_ranks()
        if ranks == 1:
            from rlcoach.trainer.lora import LoraTrainer

            return LoraTrainer(self._model_path, model.config, device=self._train_device())
        from rlcoach.trainer.distributed import DistributedTrainer

        resolved = self._placement()
        log = self.root / "logs" / f"trainer-{model.name}-{time.strftime('%Y%m%d-%H%M%S')}.log"
        if resolved is None:  # CPU ranks
            return DistributedTrainer(
                self._model_path, model.config, ranks=ranks, backend="gloo", log_file=log
            )
        env = resolved.train_env(os.environ.get("CUDA_VISIBLE_DEVICES"))
        return DistributedTrainer(
            self._model_path, model.config, ranks=ranks, backend="nccl", env=env, log_file=log
        )

    def _load_trainer(self, model: TrainableModel) -> Trainer:
        """A new trainer for `model`, resumed from its latest complete checkpoint (which
        holds its adapter and optimizer state, so it resumes exactly)."""
        gc.collect()
        trainer = self._make_trainer(model)
        latest = self.paths(model).latest_checkpoint()
        if latest is not None:
            try:
                trainer.load(latest[1])
            except BaseException:
                trainer.close()
                raise
        return trainer

    @contextlib.asynccontextmanager
    async def _leased_trainer(self, model: TrainableModel) -> AsyncIterator[_Lease]:
        """`model`'s trainer for one step (trainer/pool.py: at most `max_trainers` in
        memory, one in use never closed for another model). Unless the step marks the
        lease `kept`, the trainer is dropped at the end: a step that failed or was
        cancelled past its optimizer step left it ahead of the latest checkpoint, and the
        next step makes a new one from that checkpoint."""
        trainer = await asyncio.to_thread(
            self._pool.acquire, model.name, lambda: self._load_trainer(model)
        )
        lease = _Lease(trainer)
        try:
            yield lease
        finally:
            await asyncio.to_thread(self._pool.release, model.name, trainer, discard=not lease.kept)
            await asyncio.to_thread(after_step)

    @contextlib.asynccontextmanager
    async def _step_lock(self, model: TrainableModel) -> AsyncIterator[None]:
        """One step at a time per model (waiting at most `step_wait_timeout_s`)."""
        lock = self._step_locks.setdefault(model.name, asyncio.Lock())
        try:
            await asyncio.wait_for(lock.acquire(), self.step_wait_timeout_s)
        except TimeoutError as e:
            raise TrainerError(
                f"another step of {model.name!r} held its trainer for more than "
                f"{self.step_wait_timeout_s:.0f} s (LocalBackend(step_wait_timeout_s=...)); "
                "fix: retry once it finishes"
            ) from e
        try:
            yield
        finally:
            lock.release()

    def _trainer(self, model: TrainableModel) -> Trainer:
        """The model's trainer, made (or remade) as a step would (for tests and benches;
        steps lease it with `_leased_trainer`)."""
        trainer = self._pool.acquire(model.name, lambda: self._load_trainer(model))
        self._pool.release(model.name, trainer)
        return trainer

    @property
    def _trainers(self) -> dict[str, Trainer]:
        """The trainers in memory by model name, least recently used first."""
        return {name: t for name in self._pool.names() if (t := self._pool.peek(name))}

    async def train(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        config: TrainConfig | dict[str, Any] | None = None,
        *,
        request_id: str | None = None,
        **fields: Any,
    ) -> StepResult:
        """One step on `groups`; returns once the new adapter is served.

        `request_id` (the server passes the client's) is written into the checkpoint.
        `fields`: settings for this step, as ART's `backend.train(model, groups,
        learning_rate=...)` passes them — `TrainConfig` fields or ART's names for them
        (art_config.py) — over `config`, or the model's config.
        """
        if self.gateway is None or model.name not in self._models:
            raise ConfigError(f"model {model.name!r} is not registered with this backend")
        train_config = parse_config(TrainConfig, config) if config is not None else model.config
        await asyncio.to_thread(check_groups, groups, self.training_limits())
        if fields:
            from rlcoach.compat.art_config import train_options

            update = train_options(fields)
            train_config = parse_config(TrainConfig, {**train_config.model_dump(), **update})
        async with self._step_lock(model):
            return await self._train_step(model, groups, train_config, request_id)

    async def _train_step(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        train_config: TrainConfig,
        request_id: str | None,
    ) -> StepResult:
        """`train` under the model's step lock: the step is wholly made latest (its
        checkpoint committed, `_publish_step`) or wholly rolled back (nothing of it on
        disk or served, the trainer made again from the latest checkpoint)."""
        started = time.perf_counter()
        sinks = self.sinks(model)
        next_step = model.step + 1
        # Rendering checks client-built trajectories first: a refused one leaves no trace.
        # Rendered replies have no policy version, so the staleness bound keeps them.
        exact, rendering = await asyncio.to_thread(self._render, groups)
        sinks.log_trajectories(next_step, groups)
        fresh, staleness = drop_stale(exact, model.name, model.step, train_config.max_staleness)
        if staleness.stale_dropped:
            logger.warning(
                "step %d: %d trajectories sampled more than max_staleness=%d versions before "
                "%s are not trained",
                next_step,
                staleness.stale_dropped,
                train_config.max_staleness,
                model.served_name,
            )
        timings: dict[str, float] = {}
        try:
            async with contextlib.AsyncExitStack() as held:
                # The trainer is made while a colocated engine sleeps (GPU memory) and
                # held until the step is committed or rolled back.
                async with self._engine_asleep(timings):
                    lease = await held.enter_async_context(self._leased_trainer(model))
                    stats = await asyncio.to_thread(lease.trainer.step, fresh, train_config)
                failpoint("step.trained")
                trained = TrainedStep(stats, groups, started, staleness, timings, rendering)
                if stats.trained:
                    step_record = {"request_id": request_id, "stats": stats.as_dict()}
                    result = await self._commit(model, lease.trainer, trained, step_record)
                lease.kept = matches_checkpoint(stats)
        except Exception as e:
            await self._open_requests()
            await self._step_failed(model, next_step, e, staleness, started)
            raise
        if not stats.trained:
            await self._open_requests()
            return await self._skipped(model, next_step, trained)
        return result

    async def _skipped(self, model: TrainableModel, step: int, trained: TrainedStep) -> StepResult:
        """An RL step or SFT run that trained nothing (no reward variance, or a value that
        was not finite): its input is moved aside (`<step>-skip<k>.jsonl`, so the next
        attempt at `step` cannot overwrite it) and a `skipped` record says why."""
        sinks, stats = self.sinks(model), trained.stats
        if isinstance(stats, SFTStats):
            examples = self.paths(model).dir / "sft" / f"{step:06d}.jsonl"
            skip, _ = await asyncio.to_thread(set_aside, examples, "skip")
        else:
            skip = await asyncio.to_thread(sinks.mark_skipped, step)
        if stats.non_finite:
            why = (
                f"the loss or gradient norm of mini-batch {stats.non_finite} was not "
                "finite; nothing was saved or published"
            )
        else:
            why = "no group had reward variance; nothing trained"
        logger.warning(
            "step %d, attempt skipped %d: %s (the model stays at step %d)",
            step,
            skip,
            why,
            model.step,
        )
        result = trained.result(model.step)
        metrics = trained.metrics(model.name, step, "skipped", result, skip)
        await asyncio.to_thread(sinks.log_metrics, step, metrics)
        return result

    @contextlib.asynccontextmanager
    async def _engine_asleep(self, timings: dict[str, float]) -> AsyncIterator[None]:
        """With `colocation="sleep"`, the engine sleeps inside this block and wakes after
        it, failed or not (colocation.py); new requests wait at the router until the next
        publish or `_open_requests`. Otherwise nothing happens."""
        if self.engine_config.colocation != "sleep" or self.gateway is None:
            yield
            return
        engine: Any = self.engine
        timings["sleep_seconds"] = await self.gateway.call(
            sleep_engine(self.gateway.router, engine)
        )
        try:
            yield
        finally:
            await asyncio.to_thread(release_gpu_cache)
            timings["wake_seconds"] = await self.gateway.call(wake_engine(engine))

    async def _open_requests(self) -> None:
        """Let requests held for a sleeping engine through (a publish does it too)."""
        if self.engine_config.colocation == "sleep" and self.gateway is not None:
            await self.gateway.call(self.gateway.router.open_requests())

    async def _step_failed(
        self,
        model: TrainableModel,
        step: int,
        error: Exception,
        staleness: Staleness,
        started: float,
    ) -> None:
        """After a step failed (its trainer already dropped by its lease, so the next step
        starts from the latest checkpoint): the batch stays on disk beside the trajectory
        files (the next step's would overwrite it), and the failure is a metrics record.
        The caller re-raises."""
        batch = self.paths(model).trajectory_file(step)
        kept = batch.with_name(f"{batch.stem}-failed?.jsonl")
        with contextlib.suppress(OSError):
            _, kept = set_aside(batch, "failed")
        logger.error("step %d failed (%r); its batch is kept in %s", step, error, kept)
        record = {
            "event": "failed",
            "error": f"{type(error).__name__}: {error}",
            "batch_file": str(kept),
            **staleness.as_dict(),
            "step_seconds": time.perf_counter() - started,
            "policy": model.served_name,
        }
        self.sinks(model).log_metrics(step, record)

    def _render(self, groups: list[TrajectoryGroup]) -> tuple[list[TrajectoryGroup], dict]:
        """Client-built trajectories rendered with the chat template (trainer/render.py);
        recorded ones pass as they are."""
        from rlcoach.trainer.render import RenderStats, client_built, render_groups

        if not client_built(groups):
            return groups, RenderStats().as_dict()
        rendered, stats = render_groups(groups, self._tokenizer(), self._model_path)
        logger.info("rendered %d client-built trajectories: %s", stats.trajectories, stats)
        return rendered, stats.as_dict()

    async def train_sft(
        self,
        model: TrainableModel,
        data: Sequence[Trajectory | ChatRecord],
        config: SFTConfig | dict[str, Any] | None = None,
        *,
        progress: bool = False,
        request_id: str | None = None,
    ) -> StepResult:
        """Supervised fine-tuning on `data` (see trainer/sft.py) as one step.

        The adapter it writes is the next checkpoint, numbered and served exactly like an
        RL step, so SFT and RL can alternate on one model. The examples are written to
        `sft/<step>.jsonl` in the run folder before training starts.
        """
        if self.gateway is None or model.name not in self._models:
            raise ConfigError(f"model {model.name!r} is not registered with this backend")
        if (ranks := self._train_ranks()) > 1:
            raise ConfigError(
                f"train_sft on {ranks} training ranks: SFT on the distributed trainer is not "
                "built yet (only RL steps are); fix: run SFT with one training GPU (or "
                "cpu_train_ranks=0), then RL on several from its checkpoint"
            )
        sft_config = parse_config(SFTConfig, config)
        items = list(data)
        await asyncio.to_thread(check_examples, items, self.training_limits())
        if not items:
            raise ConfigError(
                "train_sft got no examples; fix: pass at least one Trajectory or ChatRecord"
            )
        async with self._step_lock(model):
            return await self._sft_step(model, items, sft_config, progress, request_id)

    async def _sft_step(
        self,
        model: TrainableModel,
        items: list[Trajectory | ChatRecord],
        sft_config: SFTConfig,
        progress: bool,
        request_id: str | None,
    ) -> StepResult:
        """`train_sft` under the model's step lock; committed or rolled back as a step."""
        from rlcoach.trainer.lora import LoraTrainer
        from rlcoach.trainer.sft import sft_sequences, sft_train

        started = time.perf_counter()
        next_step = model.step + 1
        await asyncio.to_thread(
            write_text_atomic,
            self.paths(model).dir / "sft" / f"{next_step:06d}.jsonl",
            "".join(item.model_dump_json() + "\n" for item in items),
        )
        tokenizer = await asyncio.to_thread(self._tokenizer)
        sequences = await asyncio.to_thread(sft_sequences, items, tokenizer)
        timings: dict[str, float] = {}
        try:
            async with contextlib.AsyncExitStack() as held:
                async with self._engine_asleep(timings):  # the trainer made while it sleeps
                    lease = await held.enter_async_context(self._leased_trainer(model))
                    trainer = lease.trainer
                    assert isinstance(trainer, LoraTrainer)  # one training rank: checked above
                    stats = await asyncio.to_thread(
                        sft_train, trainer, sequences, sft_config, len(items), progress
                    )
                if not stats.trained and not stats.non_finite:
                    lease.kept = True  # no optimizer step ran
                    raise ConfigError(
                        "the SFT examples hold no assistant token to train on; fix: "
                        "include the assistant turns the model should imitate"
                    )
                trained = TrainedStep(stats, [], started, timings=timings)
                if stats.trained:
                    step_record = {"request_id": request_id, "kind": "sft"}
                    step_record["stats"] = stats.as_dict()
                    result = await self._commit(model, trainer, trained, step_record)
                lease.kept = matches_checkpoint(stats)
        finally:
            await self._open_requests()
        if not stats.trained:
            return await self._skipped(model, next_step, trained)
        return result

    async def log(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        split: str = "val",
        *,
        metrics: Mapping[str, float] | None = None,
        step: int | None = None,
    ) -> dict[str, Any]:
        """Record groups that were not trained on (evaluation.py); returns the record."""
        from rlcoach.backend.evaluation import eval_record

        record = {**eval_record(groups, split, metrics), "policy": model.served_name}
        at = model.step if step is None else step
        return await asyncio.to_thread(self.sinks(model).log_evaluation, at, split, groups, record)

    async def delete_checkpoints(
        self,
        model: TrainableModel,
        best_checkpoint_metric: str = "val/reward",
        *,
        keep_last: int = 1,
        keep_best: int = 1,
        best_mode: Literal["max", "min"] = "max",
    ) -> list[int]:
        """Delete old checkpoints of `model` (evaluation.py says which stay), between its
        steps (under the step lock: a step in flight is committing a folder of its own)."""
        from rlcoach.backend.evaluation import delete_checkpoints

        def forget(step: int) -> None:
            if self.gateway is not None:
                self.gateway.router.checkpoints.pop(str(ServedName(model.name, step)), None)

        async with self._step_lock(model):
            return await asyncio.to_thread(
                delete_checkpoints,
                self.paths(model),
                model.step,
                best_checkpoint_metric,
                keep_last=keep_last,
                keep_best=keep_best,
                best_mode=best_mode,
                forget=forget,
            )

    def _tokenizer(self) -> Any:
        if self._tokenizer_cache is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self._model_path)
            if self.engine_config.chat_template is not None:
                tokenizer.chat_template = self.engine_config.chat_template.read_text()
            elif (fallback := fallback_chat_template(self._model_path)) is not None:
                tokenizer.chat_template = fallback
            self._tokenizer_cache = tokenizer
        return self._tokenizer_cache

    async def _commit(
        self,
        model: TrainableModel,
        trainer: Trainer,
        trained: TrainedStep,
        step_record: dict[str, Any],
    ) -> StepResult:
        """Make the trained adapter the model's next step, or nothing of it
        (step_commit.py: its folder, publish, metrics record and commit point; on any
        failure before the commit the router serves the previous step again, the folder is
        removed, and the caller's lease drops the trainer). After the commit the step's
        `metrics.jsonl` line is written (`_after_commit`)."""
        assert self.gateway is not None
        sinks = self.sinks(model)
        step = model.step + 1
        event = "sft" if isinstance(trained.stats, SFTStats) else "train"

        def metrics_record(folder: Path, save_seconds: float, publish_seconds: float) -> dict:
            done = trained.result(step, folder, save_seconds, publish_seconds)
            return sinks.metrics_record(step, trained.metrics(model.name, step, event, done))

        committed = await commit_step(
            self.gateway,
            model.name,
            trainer,
            self.paths(model),
            step,
            model.step,
            step_record,
            metrics_record,
        )
        model.step = step
        await asyncio.to_thread(self._after_commit, model)
        return trained.result(
            step, committed.folder, committed.save_seconds, committed.publish_seconds
        )

    def _after_commit(self, model: TrainableModel) -> None:
        """The committed step's `metrics.jsonl` line (and any a crash lost). Nothing here
        fails the step: a line not written now is written by the next commit or
        registration (step_commit.MetricsLedger)."""
        try:
            failpoint("step.committed")
            self._ledgers[model.name].sync(upto=model.step)
        except Exception:
            logger.exception(
                "step %d of %s is committed, but its metrics.jsonl line could not be written "
                "yet; the next step or registration writes it",
                model.step,
                model.name,
            )

    async def close(self) -> None:
        await asyncio.to_thread(self._pool.close)
        for sinks in self._sinks.values():
            await asyncio.to_thread(sinks.close)
        self._sinks.clear()
        if self._supervision is not None:
            self._supervision.cancel()
            self._supervision = None
        if self.gateway is not None and self.engine is not None:
            await self.gateway.call(self.engine.close())
            self.gateway.stop()
        self.gateway = None
        self.engine = None


@dataclass
class _Lease:
    """A step's hold on its model's trainer (`LocalBackend._leased_trainer`)."""

    trainer: Trainer
    kept: bool = False
    """Set by the step once the trainer matches the latest checkpoint again (committed, or
    no update ran); otherwise it is dropped at the end of the lease."""
