"""The commit point of a training step: a step is wholly the model's, or nothing of it is.

`LocalBackend` trains a step (RL or SFT), then hands it to `commit_step`:

1. The adapter and the step record (`rlcoach_step.json`: the request id and the stats)
   are written into a temp folder holding an `.uncommitted` marker, fsynced and renamed
   to `checkpoints/<step>/` (`write_uncommitted`); the optimizer state follows.
2. Meanwhile the adapter is published to the engine from a serving copy, written first
   in the engine's dtype to memory and not synced (serving_copies.py), so the publish
   does not wait for the disk; the router loads the step from its checkpoint folder
   from then on (`Router.relocate`).
3. The step's metrics record — the exact line `metrics.jsonl` gets — is written into the
   folder (`rlcoach_metrics.json`).
4. The marker is removed and the folder fsynced: the commit point. Only now is the step
   the model's, and only now can a retried request id be answered "replayed".

A failure before 4 (the engine refusing or dying, a full disk, a cancellation) withdraws
the published step from the router and removes the folder; a crash leaves a folder with
the marker, which registration removes (`RunPaths.remove_partial_checkpoints`). Either
way the caller drops its trainer (its optimizer already stepped), and the next step
makes one from the latest committed checkpoint.

A step that trained nothing (no reward variance, or a loss or gradient norm that was not
finite) or that failed is not committed either: its input is set aside beside the
step's files (`set_aside`) and a `skipped` or `failed` metrics record says so; where an
optimizer update of it had run, its trainer is dropped (`matches_checkpoint`). Every
outcome is described by a `TrainedStep` and returned as a `StepResult`.

After the commit nothing can undo or fail the step. Its `metrics.jsonl` line is written
by `MetricsLedger.sync`, which makes the file whole from the committed checkpoints: the
line of every committed step that has none yet, each exactly once. It runs after every
commit and when a model is registered, so a line that a crash (kill -9 between the
commit and the append) or a failed write lost is written by the next one.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rlcoach.backend.protocol import StepResult
from rlcoach.errors import CheckpointError, RLCoachError
from rlcoach.models.served_name import ServedName
from rlcoach.observe.sinks import rollout_metrics
from rlcoach.paths import (
    UNCOMMITTED,
    RunPaths,
    fsync_dir,
    fsync_tree,
    is_checkpoint,
    write_text_atomic,
)
from rlcoach.runtime.failpoints import failpoint

if TYPE_CHECKING:
    from rlcoach.backend.serving_copies import ServingCopies
    from rlcoach.endpoint.gateway import Gateway
    from rlcoach.endpoint.router import Router
    from rlcoach.rollout.staleness import Staleness
    from rlcoach.trainer.base import SFTStats, StepStats
    from rlcoach.trajectory.trajectories import TrajectoryGroup

__all__ = [
    "COMMITTED_EVENTS",
    "METRICS_RECORD",
    "STEP_RECORD",
    "CheckpointWriter",
    "Committed",
    "MetricsLedger",
    "TrainedStep",
    "commit_step",
    "matches_checkpoint",
    "set_aside",
    "write_failed",
    "write_uncommitted",
]

logger = logging.getLogger(__name__)

STEP_RECORD = "rlcoach_step.json"
"""A file in each checkpoint folder: the request id and stats of the step that wrote it."""

METRICS_RECORD = "rlcoach_metrics.json"
"""A file in each checkpoint folder: the step's `metrics.jsonl` line, written before the
commit point (so a committed step always has its line, see `MetricsLedger`)."""

COMMITTED_EVENTS = ("train", "sft", "restore")
"""The `event` of a committed step's metrics record."""


class CheckpointWriter(Protocol):
    """What the commit point needs of a trainer: its adapter and its optimizer state
    written into a folder (a `Trainer`, or a restore's copy of a checkpoint)."""

    def save_adapter(self, folder: Path, serving: bool = False) -> None: ...

    def save_optimizer(self, folder: Path) -> None: ...


@dataclass(frozen=True, slots=True)
class TrainedStep:
    """What a finished training run (an RL step or an SFT run) hands to its commit or its
    skip: the trainer's stats and what the step's result and metrics record add."""

    stats: StepStats | SFTStats
    groups: list[TrajectoryGroup]
    started: float
    staleness: Staleness | None = None
    timings: dict[str, float] = field(default_factory=dict)
    rendering: dict[str, float] = field(default_factory=dict)

    def result(
        self, step: int, folder: Path | None = None, save_s: float = 0.0, publish_s: float = 0.0
    ) -> StepResult:
        """The step's result: committed as `step` in `folder`, or skipped (no folder)."""
        return StepResult(
            step,
            self.stats,
            folder,
            publish_s,
            save_s,
            self.staleness,
            self.timings,
            self.rendering,
        )

    def metrics(
        self, model_name: str, step: int, event: str, result: StepResult, skip: int = 0
    ) -> dict[str, Any]:
        """The metrics record of this outcome, under `step`: the step its trajectories
        were logged for. A skipped attempt's record says which (`skip`: 1, 2, ... at that
        step, as in its file's name) and the step the model stayed at (`model_step`)."""
        record = {
            "event": event,
            **result.as_dict(),
            **rollout_metrics(self.groups),
            "step_seconds": time.perf_counter() - self.started,
            "policy": str(ServedName(model_name, result.step)),
            "step": step,
        }
        if skip:
            record.update(skip=skip, model_step=result.step)
        return record


def matches_checkpoint(stats: StepStats | SFTStats) -> bool:
    """Whether a finished step's trainer still matches the model's latest checkpoint: it
    committed, or it ran no optimizer update (nothing trained, or a non-finite value in
    its first mini-batch). A skipped step that updated before its non-finite mini-batch
    must not leave those updates in memory: its lease drops the trainer, made again from
    the latest checkpoint by the next step."""
    return stats.trained or stats.optimizer_steps == 0


def set_aside(file: Path, tag: str) -> tuple[int, Path]:
    """Move an attempt's input `<step>.jsonl` that no commit used to `<step>-<tag><k>.jsonl`
    (k = 1, 2, ... per attempt, so the next attempt at the step cannot overwrite it);
    return k and the new name."""
    attempt = 1 + len(list(file.parent.glob(f"{file.stem}-{tag}*.jsonl")))
    kept = file.with_name(f"{file.stem}-{tag}{attempt}.jsonl")
    if file.is_file():
        os.replace(file, kept)
    return attempt, kept


@dataclass(frozen=True, slots=True)
class Committed:
    """A committed step: its folder, its metrics record and the times its commit took."""

    folder: Path
    record: dict[str, Any]
    save_seconds: float
    publish_seconds: float


async def commit_step(
    gateway: Gateway,
    copies: ServingCopies,
    model_name: str,
    trainer: CheckpointWriter,
    paths: RunPaths,
    step: int,
    previous: int,
    step_record: dict[str, Any],
    metrics_record: Callable[[Path, float, float], dict[str, Any]],
) -> Committed:
    """Make the trained adapter of `trainer` step `step` of `model_name`, or nothing of it
    (see the module). `metrics_record(folder, save_seconds, publish_seconds)` gives the
    step's metrics record once it is published; `previous` is the step the router goes
    back to if the publish is withdrawn.

    The engine loads the step from a serving copy (serving_copies.py), written first and
    not synced, while the checkpoint folder and the optimizer state are written beside
    the publish; `save_seconds` is the serving copy's time, the part of saving a publish
    waits for (the checkpoint's own goes into the record as `checkpoint_seconds`)."""
    refuse_existing(paths, step)
    served = str(ServedName(model_name, step))
    saved = time.perf_counter()
    staged = await asyncio.to_thread(
        copies.write,
        served,
        functools.partial(trainer.save_adapter, serving=True),
        paths.dir / ".serving",
        adapter_bytes(paths.checkpoint(previous)),
    )
    save_seconds = time.perf_counter() - saved
    router = gateway.router
    published = False
    folder: Path | None = None

    def write_checkpoint() -> tuple[Path, float]:
        nonlocal folder
        started = time.perf_counter()
        folder = write_uncommitted(trainer, paths, step, step_record)
        failpoint("checkpoint.renamed")
        try:
            trainer.save_optimizer(folder)
        except Exception as e:
            raise write_failed("optimizer state", step, folder, e) from e
        return folder, time.perf_counter() - started

    try:
        outcomes = await asyncio.gather(
            gateway.call(router.publish(model_name, step, staged)),
            asyncio.to_thread(write_checkpoint),
            return_exceptions=True,
        )
        published = not isinstance(outcomes[0], BaseException)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        publish_seconds = float(outcomes[0])  # type: ignore[arg-type]
        folder, checkpoint_seconds = outcomes[1]  # type: ignore[misc]
        failpoint("step.published")
        await gateway.call(_relocate(router, served, folder))
        record = metrics_record(folder, save_seconds, publish_seconds)
        record["checkpoint_seconds"] = checkpoint_seconds
        await asyncio.to_thread(_commit, folder, record)
    except BaseException:
        if published:
            try:
                await gateway.call(_withdraw(router, model_name, step, previous))
            except Exception:
                logger.exception("could not withdraw %s@%d from the router", model_name, step)
        else:
            copies.drop(staged)  # the engine never loaded it
        if folder is not None:
            await asyncio.to_thread(shutil.rmtree, folder, True)
        raise
    return Committed(folder, record, save_seconds, publish_seconds)


def refuse_existing(paths: RunPaths, step: int) -> None:
    """A step's checkpoint folder is written once: an existing one is never replaced."""
    target = paths.checkpoint(step)
    if target.exists():
        raise CheckpointError(
            f"checkpoint {target} already exists; refusing to overwrite a saved step — "
            "fix: register the model again so it resumes from its latest checkpoint"
        )


def adapter_bytes(folder: Path) -> int:
    """The size of the adapter files in a checkpoint folder (0 when there is none): how
    much room the next serving copy needs, about."""
    try:
        return sum(f.stat().st_size for f in folder.glob("adapter_model.*"))
    except OSError:
        return 0


def write_uncommitted(
    trainer: CheckpointWriter, paths: RunPaths, step: int, record: dict[str, Any]
) -> Path:
    """Step 1 of the module: the adapter and the step record, renamed into place with the
    `UNCOMMITTED` marker; returns the folder."""
    refuse_existing(paths, step)
    target = paths.checkpoint(step)
    temp = paths.temp_checkpoint()
    try:
        (temp / UNCOMMITTED).touch()
        trainer.save_adapter(temp)
        write_text_atomic(temp / STEP_RECORD, json.dumps(record))
        fsync_tree(temp)
        os.replace(temp, target)
        fsync_dir(paths.checkpoints)
    except BaseException as e:
        shutil.rmtree(temp, ignore_errors=True)
        if (target / UNCOMMITTED).exists():  # renamed, then its fsync failed
            shutil.rmtree(target, ignore_errors=True)
        failed = write_failed("adapter", step, target, e)
        if failed is e:
            raise
        raise failed from e
    return target


def write_failed(what: str, step: int, folder: Path, error: BaseException) -> BaseException:
    """A failed checkpoint write as a `CheckpointError` that says the step left nothing
    (an error rlcoach raised, or a cancellation, passes unchanged)."""
    if isinstance(error, RLCoachError) or not isinstance(error, Exception):
        return error
    return CheckpointError(
        f"the {what} of step {step} could not be written into {folder} ({error!r}); "
        "nothing of the step was kept — fix: check the disk under the run folder (full? "
        "read-only?), then train the same batch again"
    )


def _commit(folder: Path, record: dict[str, Any]) -> None:
    """Steps 3 and 4 of the module: the metrics record, then the commit point."""
    write_text_atomic(folder / METRICS_RECORD, json.dumps(record, sort_keys=True))
    (folder / UNCOMMITTED).unlink()
    fsync_dir(folder)


async def _withdraw(router: Router, model: str, step: int, previous: int) -> None:
    router.withdraw(model, step, previous)


async def _relocate(router: Router, served: str, folder: Path) -> None:
    router.relocate(served, folder)


class MetricsLedger:
    """Keeps `metrics.jsonl` whole: every committed step's line in it, exactly once.

    `sync` writes, in step order, the metrics record (`METRICS_RECORD`) of each committed
    checkpoint whose step has no committed line (`COMMITTED_EVENTS`) in the file yet,
    through `write` (the run's sinks: the disk, then the plug-ins). The first sync, and
    the one after a failed write, read the whole file; the others look only at steps
    committed since (`sync` is called after every commit). Thread-safe."""

    def __init__(self, paths: RunPaths, write: Callable[[dict[str, Any]], None]) -> None:
        self.paths = paths
        self.write = write
        self._lock = threading.Lock()
        self._synced_to: int | None = None
        """Every committed step up to this one has its line (None: read the file)."""

    def sync(self, full: bool = False, upto: int | None = None) -> list[int]:
        """Write the missing lines; return their steps. `full`: read the whole file (a
        registration: another process may have written it). `upto`: the step just
        committed (after a commit only the folders since the last sync are looked at, so
        a step costs the same however many checkpoints the run keeps)."""
        with self._lock:
            start = None if full else self._synced_to
            if start is None or upto is None:
                committed = self.paths.complete_checkpoints()
            else:
                folders = {s: self.paths.checkpoint(s) for s in range(start + 1, upto + 1)}
                committed = {s: f for s, f in folders.items() if is_checkpoint(f)}
            logged = _logged_steps(self.paths.metrics) if start is None else set()
            start = -1 if start is None else start
            written = []
            self._synced_to = None  # until every write below has succeeded
            for step in sorted(s for s in committed if s > start and s not in logged):
                record_file = committed[step] / METRICS_RECORD
                try:
                    record = json.loads(record_file.read_text(encoding="utf-8"))
                except FileNotFoundError:
                    continue  # written by an rlcoach that kept no record in the folder
                except (OSError, ValueError) as e:
                    logger.warning("step %d: unreadable %s (%r)", step, record_file, e)
                    continue
                self.write(record)
                written.append(step)
            self._synced_to = max([start, *committed])
            return written


def _logged_steps(metrics: Path) -> set[int]:
    """The steps with a committed step's line in `metrics` (torn lines skipped)."""
    steps: set[int] = set()
    if not metrics.is_file():
        return steps
    with open(metrics, encoding="utf-8") as handle:
        for line in handle:
            if '"event"' not in line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if (
                isinstance(record, dict)
                and record.get("event") in COMMITTED_EVENTS
                and isinstance(record.get("step"), int)
            ):
                steps.add(record["step"])
    return steps
