"""One training step of a `LocalBackend`: trained, then committed or rolled back.

An RL step (`rl`) renders client-built trajectories, logs the groups before anything
trains (a crash mid-step loses no trajectory), drops samples staler than
`TrainConfig.max_staleness` (staleness.py), leases the model's trainer while a
colocated engine sleeps, runs one LoRA step in a worker thread and hands it to the
commit point (step_commit.py). An SFT run (`sft`) writes its examples to
`sft/<step>.jsonl` and is committed the same way, so SFT and RL alternate on one model.
Every outcome is one of: committed (the model's step + 1, its `metrics.jsonl` line
written after the commit), skipped (nothing trained: its input set aside and a
`skipped` record), or failed (its batch kept, a `failed` record, the error raised; the
trainer is dropped, and the next step makes one from the latest checkpoint). The
caller holds the model's step lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlcoach.backend.engine_host import EngineHost
from rlcoach.backend.protocol import StepResult
from rlcoach.backend.retention import OPTIMIZER_FILE
from rlcoach.backend.step_commit import (
    METRICS_RECORD,
    STEP_RECORD,
    MetricsLedger,
    TrainedStep,
    commit_step,
    matches_checkpoint,
    set_aside,
)
from rlcoach.backend.trainer_leases import TrainerLeases
from rlcoach.config import SFTConfig, TrainConfig
from rlcoach.errors import ConfigError
from rlcoach.models.served_name import ServedName
from rlcoach.observe.sinks import SinkSet
from rlcoach.paths import RunPaths, write_text_atomic
from rlcoach.rollout.staleness import Staleness, drop_stale
from rlcoach.runtime.failpoints import failpoint
from rlcoach.trainer.base import SFTStats, StepStats, Trainer
from rlcoach.trajectory.trajectories import ChatRecord, Trajectory, TrajectoryGroup

if TYPE_CHECKING:
    from rlcoach.model import TrainableModel

__all__ = ["CheckpointCopy", "StepRunner"]

logger = logging.getLogger(__name__)


class StepRunner:
    """Train a step and commit it, or set it aside, or record its failure."""

    def __init__(
        self,
        host: EngineHost,
        leases: TrainerLeases,
        sinks: Callable[[TrainableModel], SinkSet],
        paths: Callable[[TrainableModel], RunPaths],
        ledgers: dict[str, MetricsLedger],
    ) -> None:
        self._host = host
        self._leases = leases
        self._sinks = sinks
        self._paths = paths
        self._ledgers = ledgers

    async def rl(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        train_config: TrainConfig,
        request_id: str | None,
    ) -> StepResult:
        """An RL step: wholly made latest (its checkpoint committed and published) or
        wholly rolled back (nothing of it on disk or served)."""
        started = time.perf_counter()
        sinks = self._sinks(model)
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
                async with self._host.engine_asleep(timings):
                    lease = await held.enter_async_context(self._leases.leased(model))
                    stats = await asyncio.to_thread(lease.trainer.step, fresh, train_config)
                failpoint("step.trained")
                trained = TrainedStep(stats, groups, started, staleness, timings, rendering)
                if stats.trained:
                    step_record = {"request_id": request_id, "stats": stats.as_dict()}
                    result = await self._commit(model, lease.trainer, trained, step_record)
                lease.kept = matches_checkpoint(stats)
        except Exception as e:
            await self._host.open_requests()
            await self._failed(model, next_step, e, staleness, started)
            raise
        if not stats.trained:
            await self._host.open_requests()
            return await self._skipped(model, next_step, trained)
        return result

    async def sft(
        self,
        model: TrainableModel,
        items: list[Trajectory | ChatRecord],
        sft_config: SFTConfig,
        progress: bool,
        request_id: str | None,
    ) -> StepResult:
        """An SFT run on one training rank, committed or rolled back as a step."""
        from rlcoach.trainer.lora import LoraTrainer
        from rlcoach.trainer.sft import sft_sequences, sft_train

        started = time.perf_counter()
        next_step = model.step + 1
        await asyncio.to_thread(
            write_text_atomic,
            self._paths(model).dir / "sft" / f"{next_step:06d}.jsonl",
            "".join(item.model_dump_json() + "\n" for item in items),
        )
        tokenizer = await asyncio.to_thread(self._host.tokenizer)
        sequences = await asyncio.to_thread(sft_sequences, items, tokenizer)
        timings: dict[str, float] = {}
        try:
            async with contextlib.AsyncExitStack() as held:
                async with self._host.engine_asleep(timings):  # the trainer made meanwhile
                    lease = await held.enter_async_context(self._leases.leased(model))
                    trainer = lease.trainer
                    assert isinstance(trainer, LoraTrainer)  # one training rank: checked
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
                    step_record = {
                        "request_id": request_id,
                        "kind": "sft",
                        "stats": stats.as_dict(),
                    }
                    result = await self._commit(model, trainer, trained, step_record)
                lease.kept = matches_checkpoint(stats)
        finally:
            await self._host.open_requests()
        if not stats.trained:
            return await self._skipped(model, next_step, trained)
        return result

    async def restore(self, model: TrainableModel, step: int) -> int:
        """Make checkpoint `step` the model's latest again, as a new step committed like
        any other (its adapter and optimizer state copied, published, a `restore` metrics
        record); the trainer in memory is dropped. Returns the new step."""
        paths = self._paths(model)
        source = paths.complete_checkpoints().get(step)
        if source is None:
            raise ConfigError(
                f"model {model.name!r} has no committed checkpoint {step} to restore; fix: "
                f"restore one of its steps {sorted(paths.complete_checkpoints())}"
            )
        assert self._host.gateway is not None
        sinks, new = self._sinks(model), model.step + 1

        def metrics_record(folder: Path, save_seconds: float, publish_seconds: float) -> dict:
            record = {"event": "restore", "restored_from": step, "step": new}
            record |= {"save_seconds": save_seconds, "publish_seconds": publish_seconds}
            record["policy"] = str(ServedName(model.name, new))
            return sinks.metrics_record(new, record)

        await commit_step(
            self._host.gateway,
            self._host.serving_copies,
            model.name,
            CheckpointCopy(source),
            paths,
            new,
            model.step,
            {"restored_from": step},
            metrics_record,
        )
        model.step = new
        self._leases.forget(model)
        await asyncio.to_thread(self._after_commit, model)
        logger.info("%s restored checkpoint %d as step %d", model.name, step, new)
        return new

    async def _skipped(self, model: TrainableModel, step: int, trained: TrainedStep) -> StepResult:
        """An RL step or SFT run that trained nothing (no reward variance, or a value that
        was not finite): its input is moved aside (`<step>-skip<k>.jsonl`, so the next
        attempt at `step` cannot overwrite it) and a `skipped` record says why."""
        sinks, stats = self._sinks(model), trained.stats
        if isinstance(stats, SFTStats):
            examples = self._paths(model).dir / "sft" / f"{step:06d}.jsonl"
            skip, _ = await asyncio.to_thread(set_aside, examples, "skip")
        else:
            skip = await asyncio.to_thread(sinks.mark_skipped, step)
        if stats.non_finite:
            why = (
                f"the loss or gradient norm of mini-batch {stats.non_finite} was not "
                "finite; nothing was saved or published"
            )
        elif isinstance(stats, StepStats) and stats.groups_skipped_no_variance < stats.groups:
            staleness = trained.staleness or Staleness(0, model.step)
            why = (
                "no token to train: every trajectory was too stale "
                f"({staleness.stale_dropped} dropped) or every sampled token was forced "
                "by a constraint or left to the trainer's log-probs while other weights "
                f"sampled it ({staleness.unscored_untrained} such replies)"
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

    async def _failed(
        self,
        model: TrainableModel,
        step: int,
        error: Exception,
        staleness: Staleness,
        started: float,
    ) -> None:
        """After a step failed (its trainer already dropped by its lease): the batch stays
        on disk beside the trajectory files (the next step's would overwrite it), and the
        failure is a metrics record. The caller re-raises."""
        batch = self._paths(model).trajectory_file(step)
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
        self._sinks(model).log_metrics(step, record)

    def _render(self, groups: list[TrajectoryGroup]) -> tuple[list[TrajectoryGroup], dict]:
        """Client-built trajectories rendered with the chat template (trainer/render.py);
        recorded ones pass as they are."""
        from rlcoach.trainer.render import RenderStats, client_built, render_groups

        if not client_built(groups):
            return groups, RenderStats().as_dict()
        rendered, stats = render_groups(groups, self._host.tokenizer(), self._host.model_path)
        logger.info("rendered %d client-built trajectories: %s", stats.trajectories, stats)
        return rendered, stats.as_dict()

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
        assert self._host.gateway is not None
        sinks = self._sinks(model)
        step = model.step + 1
        event = "sft" if isinstance(trained.stats, SFTStats) else "train"

        def metrics_record(folder: Path, save_seconds: float, publish_seconds: float) -> dict:
            done = trained.result(step, folder, save_seconds, publish_seconds)
            return sinks.metrics_record(step, trained.metrics(model.name, step, event, done))

        committed = await commit_step(
            self._host.gateway,
            self._host.serving_copies,
            model.name,
            trainer,
            self._paths(model),
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


class CheckpointCopy:
    """What the commit point needs of a trainer (`save_adapter`, `save_optimizer`), read
    from a committed checkpoint: a restore commits an earlier step's files as a new step."""

    def __init__(self, source: Path) -> None:
        self.source = source

    def save_adapter(self, folder: Path, serving: bool = False) -> None:
        for entry in self.source.iterdir():
            if entry.name in (STEP_RECORD, METRICS_RECORD, OPTIMIZER_FILE):
                continue
            if entry.is_dir():
                shutil.copytree(entry, folder / entry.name)
            else:
                shutil.copy2(entry, folder / entry.name)

    def save_optimizer(self, folder: Path) -> None:
        if (self.source / OPTIMIZER_FILE).is_file():
            shutil.copy2(self.source / OPTIMIZER_FILE, folder / OPTIMIZER_FILE)
