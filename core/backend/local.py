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

`LocalBackend` is an assembly of parts: the engine host (engine_host.py: the engine, the
gateway, what they say about the machine), the trainer leases (trainer_leases.py), the
step runner (step.py: a step trained, then committed, set aside or failed), and the sinks
and metrics ledger of each registered model. `Backend` (protocol.py) is what a
`TrainableModel` needs from any backend; `RemoteBackend` implements it over HTTP against
`rlcoach serve`, so user code switches between the two by one line. A step trained for a
request id (the server passes the client's) records that id inside its checkpoint
folder, so a retried request is recognised as done once the step has committed, even if
the server died right after.

Each registered model gets a `SinkSet` (sinks.py): the disk record (trajectories before
the step, a line of `metrics.jsonl` after its commit, written again from the checkpoint
at registration if a crash lost it) and the plug-ins the `sinks` config names
or the environment asks for (Langfuse, W&B), which never block or fail a step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rlcoach.backend.engine_host import EngineHost
from rlcoach.backend.protocol import Backend, StepResult
from rlcoach.backend.step import StepRunner
from rlcoach.backend.step_commit import STEP_RECORD, MetricsLedger
from rlcoach.backend.supervisor import EngineSupervisor
from rlcoach.backend.trainer_leases import TrainerLeases
from rlcoach.backend.training_input import TrainingLimits, check_examples, check_groups
from rlcoach.config import EngineConfig, SFTConfig, TrainConfig, parse_config
from rlcoach.endpoint.gateway import Gateway
from rlcoach.engines.base import Engine
from rlcoach.errors import ConfigError
from rlcoach.models.base_model import resolve_base_model, served_base_name
from rlcoach.models.bundled import BUNDLED_MODEL
from rlcoach.models.families import fallback_chat_template
from rlcoach.models.served_name import ServedName
from rlcoach.observe.sinks import Sink, SinkConfig, SinkSet, open_sinks, resolve_sinks, run_info
from rlcoach.paths import DEFAULT_ROOT, RunPaths
from rlcoach.trainer.base import Trainer
from rlcoach.trajectory.exchange import Exchange
from rlcoach.trajectory.trajectories import ChatRecord, Trajectory, TrajectoryGroup

if TYPE_CHECKING:
    from rlcoach.model import TrainableModel

__all__ = [
    "STEP_RECORD",
    "Backend",
    "LocalBackend",
    "StepResult",
    "resolve_base_model",
    "served_base_name",
]

logger = logging.getLogger(__name__)


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
        self.step_wait_timeout_s = step_wait_timeout_s
        self.host = EngineHost(parse_config(EngineConfig, engine), self._make_engine)
        self.leases = TrainerLeases(
            self.host, self.root, self.paths, max_trainers, step_wait_timeout_s
        )
        self._models: dict[str, TrainableModel] = {}
        self.sink_config, self._sink_objects = resolve_sinks(sinks)
        self._sinks: dict[str, SinkSet] = {}
        self._ledgers: dict[str, MetricsLedger] = {}
        self.steps = StepRunner(self.host, self.leases, self.sinks, self.paths, self._ledgers)

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

    # The engine host's parts, under the names user code and tests have always used.
    @property
    def engine_config(self) -> EngineConfig:
        return self.host.engine_config

    @property
    def engine(self) -> Engine | None:
        return self.host.engine

    @property
    def gateway(self) -> Gateway | None:
        return self.host.gateway

    @property
    def base_model(self) -> str | None:
        return self.host.base_model

    @property
    def supervisor(self) -> EngineSupervisor | None:
        return self.host.supervisor

    @property
    def _model_path(self) -> Path | None:
        return self.host.model_path

    @_model_path.setter
    def _model_path(self, path: Path | None) -> None:  # tests that start no engine
        self.host.model_path = path

    def training_limits(self) -> TrainingLimits:
        """The vocabulary and context that training input must fit (training_input.py)."""
        return self.host.training_limits()

    def _trainer(self, model: TrainableModel) -> Trainer:
        """The model's trainer, made (or remade) as a step would (for tests and benches)."""
        return self.leases.trainer(model)

    @property
    def _trainers(self) -> dict[str, Trainer]:
        """The trainers in memory by model name, least recently used first."""
        return self.leases.in_memory()

    async def start(self, base_model: str = BUNDLED_MODEL) -> None:
        """Start the engine and the gateway now (`register` does it on first use)."""
        if self.gateway is None:
            await self.host.start(base_model, TrainConfig())

    @property
    def can_overlap(self) -> bool:
        """Whether rollouts can run while a step trains without slowing each other down:
        on GPUs with the engine resident (not on a CPU, whose cores both would share, nor
        with a sleeping engine). The async pipeline's default (pipeline.py)."""
        return self.host.placement() is not None and self.engine_config.colocation != "sleep"

    def _make_engine(self, model_path: Path, base_name: str) -> Engine:
        """The engine `EngineConfig.kind` names (the one seam tests put a stand-in into)."""
        c = self.host.engine_config
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

    async def register(self, model: TrainableModel) -> None:
        if self.gateway is None:
            await self.host.start(model.base_model, model.config, model.engine_overrides)
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
        self.host.check_lora_rank(model, paths)
        if not self.leases.stepping(model):  # else its step owns that folder
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

    def sinks(self, model: TrainableModel) -> SinkSet:
        """The sinks recording `model`'s run (the disk record and the plug-ins)."""
        if model.name not in self._sinks:
            raise ConfigError(f"model {model.name!r} is not registered with this backend")
        return self._sinks[model.name]

    def paths(self, model: TrainableModel) -> RunPaths:
        return RunPaths(self.root, model.project, model.name)

    async def take_exchanges(self, rollout_id: str) -> list[Exchange]:
        if self.gateway is None:
            return []
        return self.gateway.recorder.take(rollout_id)

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
        await asyncio.to_thread(check_groups, groups, self.host.training_limits())
        if fields:
            from rlcoach.compat.art_config import train_options

            update = train_options(fields)
            train_config = parse_config(TrainConfig, {**train_config.model_dump(), **update})
        async with self.leases.step_lock(model):
            return await self.steps.rl(model, groups, train_config, request_id)

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
        if (ranks := self.host.train_ranks()) > 1:
            raise ConfigError(
                f"train_sft on {ranks} training ranks: SFT on the distributed trainer is not "
                "built yet (only RL steps are); fix: run SFT with one training GPU (or "
                "cpu_train_ranks=0), then RL on several from its checkpoint"
            )
        sft_config = parse_config(SFTConfig, config)
        items = list(data)
        await asyncio.to_thread(check_examples, items, self.host.training_limits())
        if not items:
            raise ConfigError(
                "train_sft got no examples; fix: pass at least one Trajectory or ChatRecord"
            )
        async with self.leases.step_lock(model):
            return await self.steps.sft(model, items, sft_config, progress, request_id)

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

    async def restore(self, model: TrainableModel, step: int) -> int:
        """Make checkpoint `step` `model`'s latest again, as a new committed step (step.py);
        returns the new step."""
        if self.gateway is None or model.name not in self._models:
            raise ConfigError(f"model {model.name!r} is not registered with this backend")
        async with self.leases.step_lock(model):
            return await self.steps.restore(model, step)

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

        async with self.leases.step_lock(model):
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

    async def close(self) -> None:
        await asyncio.to_thread(self.leases.close)
        for sinks in self._sinks.values():
            await asyncio.to_thread(sinks.close)
        self._sinks.clear()
        await self.host.close()
