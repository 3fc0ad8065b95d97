"""The engine host: the inference engine and the policy endpoint in front of it, on this
machine, for one base model.

`start` resolves the base model, makes the engine (the backend's `_make_engine`: vLLM
as a subprocess, or the transformers engine), checks on a GPU that the engine and the
trainer fit (runtime/memory.py), and starts the gateway (endpoint/gateway.py) with its
router and recorder; an engine that can be restarted gets a supervisor
(supervisor.py). The host also answers what the rest of the backend asks of the
machine: the GPU placement and the trainer's device and ranks, the vocabulary and
context that training input must fit, the chat template's tokenizer, and, with
`colocation="sleep"`, the engine asleep while a step trains (colocation.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlcoach.backend.colocation import (
    check_sleep_mode,
    release_gpu_cache,
    sleep_engine,
    wake_engine,
)
from rlcoach.backend.serving_copies import ServingCopies
from rlcoach.backend.supervisor import EngineSupervisor, RestartableEngine
from rlcoach.backend.training_input import TrainingLimits, training_limits
from rlcoach.config import EngineConfig, TrainConfig, parse_config
from rlcoach.endpoint.gateway import Gateway, Recorder
from rlcoach.endpoint.router import Router
from rlcoach.engines.base import Engine
from rlcoach.errors import ConfigError
from rlcoach.models.base_model import resolve_base_model, served_base_name
from rlcoach.models.families import fallback_chat_template

if TYPE_CHECKING:
    from rlcoach.model import TrainableModel
    from rlcoach.paths import RunPaths
    from rlcoach.runtime.placement import Placement

__all__ = ["EngineHost"]

MakeEngine = Callable[[Path, str], Engine]


class EngineHost:
    """The engine and the gateway of a `LocalBackend`, and what they say about the machine."""

    def __init__(self, engine_config: EngineConfig, make_engine: MakeEngine) -> None:
        self.engine_config = engine_config
        self._make_engine = make_engine
        self.engine: Engine | None = None
        self.gateway: Gateway | None = None
        self.base_model: str | None = None
        self.model_path: Path | None = None
        self.supervisor: EngineSupervisor | None = None
        self._supervision: Any = None
        self._limits: TrainingLimits | None = None
        self._tokenizer: Any = None
        self.serving_copies = ServingCopies()

    async def start(
        self,
        base_model: str,
        train_config: TrainConfig,
        engine_overrides: Mapping[str, Any] | None = None,
    ) -> None:
        """Start the engine for `base_model`: `train_config` sizes the GPU memory check,
        `engine_overrides` (a model's `EngineConfig` fields, from ART's `_internal_config`)
        are applied to the engine config first."""
        self.model_path = await asyncio.to_thread(resolve_base_model, base_model)
        if engine_overrides:
            fields = {**self.engine_config.model_dump(), **engine_overrides}
            fields["extra_args"] = [
                *self.engine_config.extra_args,
                *engine_overrides.get("extra_args", []),
            ]
            self.engine_config = parse_config(EngineConfig, fields)
        c = self.engine_config
        engine = self._make_engine(self.model_path, served_base_name(base_model))
        placement = getattr(engine, "placement", None)
        resolved = placement() if callable(placement) else None
        if resolved is not None:
            from rlcoach.runtime.memory import check_gpu_memory

            await asyncio.to_thread(check_gpu_memory, self.model_path, c, train_config, resolved)
        if c.colocation == "sleep":
            gpus = (resolved.serve_gpus, resolved.train_gpus) if resolved else ((), ())
            check_sleep_mode(engine, *gpus)
        recorder = Recorder(c.max_recorded_rollouts, ttl_s=c.recording_ttl_s)
        router = Router(
            engine,
            c.max_loras,
            wait_timeout_s=c.adapter_wait_timeout_s,
            on_unload=self.serving_copies.drop,
        )
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

    def placement(self) -> Placement | None:
        """The engine's GPU placement (None on a CPU or for an engine without one)."""
        placement = getattr(self.engine, "placement", None)
        return placement() if callable(placement) else None

    def train_device(self) -> str | None:
        """The trainer's GPU from the engine's placement (None: the trainer's default)."""
        resolved = self.placement()
        return resolved.train_device() if resolved is not None else None

    def train_ranks(self) -> int:
        """How many ranks train: the training GPUs, or the CPU ranks asked for (1: one
        process, `LoraTrainer`)."""
        resolved = self.placement()
        if resolved is not None:
            return len(resolved.train_gpus)
        return max(self.engine_config.placement.cpu_train_ranks, 1)

    def check_lora_rank(self, model: TrainableModel, paths: RunPaths) -> None:
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
            if self.model_path is None:
                raise ConfigError("the backend is not started; register a model first")
            self._limits = training_limits(self.model_path, self.engine_config.max_model_len)
        return self._limits

    def tokenizer(self) -> Any:
        """The base model's tokenizer with the chat template the engine serves."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            if self.model_path is None:
                raise ConfigError("the backend is not started; register a model first")

            tokenizer = AutoTokenizer.from_pretrained(self.model_path)
            if self.engine_config.chat_template is not None:
                tokenizer.chat_template = self.engine_config.chat_template.read_text()
            elif (fallback := fallback_chat_template(self.model_path)) is not None:
                tokenizer.chat_template = fallback
            self._tokenizer = tokenizer
        return self._tokenizer

    @contextlib.asynccontextmanager
    async def engine_asleep(self, timings: dict[str, float]) -> AsyncIterator[None]:
        """With `colocation="sleep"`, the engine sleeps inside this block and wakes after
        it, failed or not (colocation.py); new requests wait at the router until the next
        publish or `open_requests`. Otherwise nothing happens."""
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

    async def open_requests(self) -> None:
        """Let requests held for a sleeping engine through (a publish does it too)."""
        if self.engine_config.colocation == "sleep" and self.gateway is not None:
            await self.gateway.call(self.gateway.router.open_requests())

    async def close(self) -> None:
        if self._supervision is not None:
            self._supervision.cancel()
            self._supervision = None
        if self.gateway is not None and self.engine is not None:
            await self.gateway.call(self.engine.close())
            self.gateway.stop()
        self.gateway = None
        self.engine = None
        self.serving_copies.close()
