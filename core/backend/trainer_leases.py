"""Trainer leases: each model's trainer for one step at a time, and one step per model.

A step leases its model's trainer from the pool (trainer/pool.py: at most `max_trainers`
in memory, each holding a copy of the base model; one in use is never closed for
another model). The trainer is made from the latest complete checkpoint (adapter and
optimizer state, so it resumes exactly): `LoraTrainer` in this process, or, where the
placement names several training GPUs (or `cpu_train_ranks` asks for CPU ranks),
`DistributedTrainer` with torchrun ranks under FSDP2, logging under `<root>/logs/`.
Unless the step marks its lease `kept`, the trainer is dropped at the end of it: a step
that failed or was cancelled past its optimizer step left it ahead of the checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rlcoach.backend.engine_host import EngineHost
from rlcoach.errors import TrainerError
from rlcoach.paths import RunPaths
from rlcoach.runtime.heap import after_step
from rlcoach.trainer.base import Trainer
from rlcoach.trainer.pool import TrainerPool

if TYPE_CHECKING:
    from rlcoach.model import TrainableModel

__all__ = ["Lease", "TrainerLeases"]


@dataclass
class Lease:
    """A step's hold on its model's trainer (`TrainerLeases.leased`)."""

    trainer: Trainer
    kept: bool = False
    """Set by the step once the trainer matches the latest checkpoint again (committed, or
    no update ran); otherwise it is dropped at the end of the lease."""


class TrainerLeases:
    """The trainers of a backend's models, and the per-model step lock."""

    def __init__(
        self,
        host: EngineHost,
        root: Path,
        paths: Callable[[TrainableModel], RunPaths],
        max_trainers: int,
        wait_timeout_s: float,
    ) -> None:
        self._host = host
        self._root = root
        self._paths = paths
        self.wait_timeout_s = wait_timeout_s
        self.pool = TrainerPool(max_trainers, wait_timeout_s=wait_timeout_s)
        self._step_locks: dict[str, asyncio.Lock] = {}

    def _make(self, model: TrainableModel) -> Trainer:
        model_path = self._host.model_path
        assert model_path is not None
        ranks = self._host.train_ranks()
        if ranks == 1:
            from rlcoach.trainer.lora import LoraTrainer

            return LoraTrainer(model_path, model.config, device=self._host.train_device())
        from rlcoach.trainer.distributed import DistributedTrainer

        resolved = self._host.placement()
        log = self._root / "logs" / f"trainer-{model.name}-{time.strftime('%Y%m%d-%H%M%S')}.log"
        if resolved is None:  # CPU ranks
            return DistributedTrainer(
                model_path, model.config, ranks=ranks, backend="gloo", log_file=log
            )
        env = resolved.train_env(os.environ.get("CUDA_VISIBLE_DEVICES"))
        return DistributedTrainer(
            model_path, model.config, ranks=ranks, backend="nccl", env=env, log_file=log
        )

    def _load(self, model: TrainableModel) -> Trainer:
        """A new trainer for `model`, resumed from its latest complete checkpoint."""
        gc.collect()
        trainer = self._make(model)
        latest = self._paths(model).latest_checkpoint()
        if latest is not None:
            try:
                trainer.load(latest[1])
            except BaseException:
                trainer.close()
                raise
        return trainer

    @contextlib.asynccontextmanager
    async def leased(self, model: TrainableModel) -> AsyncIterator[Lease]:
        """`model`'s trainer for one step; dropped at the end unless the step keeps it."""
        trainer = await asyncio.to_thread(self.pool.acquire, model.name, lambda: self._load(model))
        lease = Lease(trainer)
        try:
            yield lease
        finally:
            await asyncio.to_thread(self.pool.release, model.name, trainer, discard=not lease.kept)
            await asyncio.to_thread(after_step)

    @contextlib.asynccontextmanager
    async def step_lock(self, model: TrainableModel) -> AsyncIterator[None]:
        """One step at a time per model (waiting at most `wait_timeout_s`)."""
        lock = self._step_locks.setdefault(model.name, asyncio.Lock())
        try:
            await asyncio.wait_for(lock.acquire(), self.wait_timeout_s)
        except TimeoutError as e:
            raise TrainerError(
                f"another step of {model.name!r} held its trainer for more than "
                f"{self.wait_timeout_s:.0f} s (LocalBackend(step_wait_timeout_s=...)); "
                "fix: retry once it finishes"
            ) from e
        try:
            yield
        finally:
            lock.release()

    def stepping(self, model: TrainableModel) -> bool:
        """Whether a step of `model` holds its lock now (and so owns its run folder)."""
        lock = self._step_locks.get(model.name)
        return lock is not None and lock.locked()

    def trainer(self, model: TrainableModel) -> Trainer:
        """The model's trainer, made (or remade) as a step would (for tests and benches)."""
        trainer = self.pool.acquire(model.name, lambda: self._load(model))
        self.pool.release(model.name, trainer)
        return trainer

    def in_memory(self) -> dict[str, Trainer]:
        """The trainers in memory by model name, least recently used first."""
        return {name: t for name in self.pool.names() if (t := self.pool.peek(name))}

    def forget(self, model: TrainableModel) -> None:
        """Drop `model`'s trainer in memory: its latest checkpoint is not what it holds."""
        self.pool.forget(model.name)

    def close(self) -> None:
        self.pool.close()
