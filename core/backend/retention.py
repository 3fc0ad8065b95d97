"""Retention: which checkpoints, optimizer states, request files and logs a run keeps.

A server that trains for days writes a checkpoint (and an optimizer state twice its
size) every step, a request file per upload and an engine log per start; nothing else
ever removes them. After each finished step `rlcoach serve` applies a `RetentionConfig`:

- checkpoints: the latest always stays; so do the `keep_last` newest, the `keep_best`
  best by `best_metric` (read from `metrics.jsonl`: the step's record, e.g. `reward_mean`
  of the trajectories it trained on, an evaluation's `val/reward` from `model.log`, or
  any number a sink wrote there), and every step in `pinned`. `keep_last=None` (the
  default) keeps them all. `steps_to_keep` is the rule; `model.delete_checkpoints()`
  applies the same one (evaluation.py), on this machine or through serve.
- optimizer states: only the newest `optimizer_keep_last` checkpoints keep theirs (a
  model resumes from its latest; an older checkpoint stays servable without one).
- request files (`requests/<id>.jsonl` and `<id>.result.json`): the newest
  `requests_keep_last` ids. A retry of an older id is still recognised as trained from its
  checkpoint's step record while that checkpoint is kept.
- engine and trainer logs under `<root>/logs`: the newest `logs_keep_last`.

A checkpoint is removed by renaming it to a `.tmp-` name first (which a restart cleans
up), so a crash mid-removal never leaves a half folder that looks like a checkpoint.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field

from rlcoach.errors import ConfigError
from rlcoach.paths import RunPaths
from rlcoach.validation import Config

__all__ = [
    "SCORED_EVENTS",
    "Pruned",
    "RetentionConfig",
    "apply_retention",
    "metric_by_step",
    "read_metric",
    "remove_checkpoint",
    "steps_to_keep",
]

logger = logging.getLogger(__name__)

OPTIMIZER_FILE = "optimizer.pt"  # the trainer's name for it (trainer/lora.py)


class RetentionConfig(Config):
    """What a run keeps on disk; the defaults keep every checkpoint."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    keep_last: int | None = Field(None, ge=1)
    """Newest checkpoints kept (None: all). The latest is always kept."""
    keep_best: int = Field(0, ge=0)
    """Also keep the best N steps by `best_metric`."""
    best_metric: str = "reward_mean"
    """A number in the steps' `metrics.jsonl` records."""
    best_mode: Literal["max", "min"] = "max"
    pinned: list[int] = Field(default_factory=list)
    """Steps never removed."""
    optimizer_keep_last: int | None = Field(1, ge=1)
    """Newest checkpoints that keep their optimizer state (None: all)."""
    requests_keep_last: int | None = Field(1000, ge=1)
    """Newest request ids whose files are kept (None: all)."""
    logs_keep_last: int | None = Field(10, ge=1)
    """Newest logs kept under `<root>/logs` (None: all)."""


@dataclass
class Pruned:
    """What one pass removed."""

    checkpoints: list[int] = field(default_factory=list)
    optimizer_states: int = 0
    request_files: int = 0
    logs: int = 0

    def counts(self) -> dict[str, int]:
        return {
            "checkpoints": len(self.checkpoints),
            "optimizer_states": self.optimizer_states,
            "request_files": self.request_files,
            "logs": self.logs,
        }


def remove_checkpoint(folder: Path) -> None:
    """Remove a checkpoint folder: renamed out of the way first, then deleted."""
    doomed = folder.with_name(f".tmp-removing-{folder.name}")
    os.replace(folder, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def metric_by_step(
    records: Iterable[Any], metric: str, events: Container[str] | None = None
) -> dict[int, float]:
    """`metric`'s value per step in `metrics.jsonl` records (the mean where a step has
    several), from records of `events` (None: any); non-finite values are skipped."""
    values: dict[int, list[float]] = {}
    for record in records:
        if not isinstance(record, dict) or (
            events is not None and record.get("event") not in events
        ):
            continue
        value, step = record.get(metric), record.get("step")
        if (
            isinstance(step, int)
            and isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
        ):
            values.setdefault(step, []).append(float(value))
    return {step: sum(v) / len(v) for step, v in values.items()}


SCORED_EVENTS = ("train", "sft", "eval")
"""Records a best metric is read from: steps (their rollouts' numbers) and evaluations
(`model.log`'s `<split>/...`); a skipped attempt's record is not a checkpoint's."""


def read_metric(metrics_file: Path, metric: str) -> dict[int, float]:
    """`metric` per step in a run's `metrics.jsonl` (`SCORED_EVENTS`; torn lines skipped)."""
    if not metrics_file.is_file():
        return {}
    records = []
    for line in metrics_file.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except (ValueError, RecursionError):
            continue  # a line torn by a crash
    return metric_by_step(records, metric, SCORED_EVENTS)


def steps_to_keep(
    steps: Iterable[int],
    latest: int,
    *,
    keep_last: int = 1,
    keep_best: int = 0,
    scores: Mapping[int, float] | None = None,
    mode: Literal["max", "min"] = "max",
) -> set[int]:
    """The checkpoint steps a retention rule keeps: `latest` always, the `keep_last`
    newest, and the `keep_best` best by `scores` among the existing checkpoints."""
    if keep_last < 1 or keep_best < 0:
        raise ConfigError(
            f"keep_last={keep_last!r} must be at least 1 and keep_best={keep_best!r} at "
            "least 0; fix: e.g. keep_last=1, keep_best=1 (the latest and the best)"
        )
    if mode not in ("max", "min"):
        raise ConfigError(f"best_mode={mode!r} must be 'max' or 'min'; fix: pick one of them")
    existing = sorted(set(steps))
    scored = {s: v for s, v in (scores or {}).items() if s in existing}
    ranked = sorted(scored, key=scored.__getitem__, reverse=mode == "max")
    return set(existing[-keep_last:]) | {latest} | set(ranked[:keep_best])


def _checkpoint_steps(paths: RunPaths) -> list[int]:
    if not paths.checkpoints.is_dir():
        return []
    return sorted(int(p.name) for p in paths.checkpoints.iterdir() if p.name.isdigit())


def apply_retention(
    paths: RunPaths, config: RetentionConfig, latest_step: int, logs: Path | None = None
) -> Pruned:
    """Prune one run's folder (and `logs`) by `config`; `latest_step` is never touched."""
    pruned = Pruned()
    steps = _checkpoint_steps(paths)
    if config.keep_last is not None:
        scores = read_metric(paths.metrics, config.best_metric) if config.keep_best else {}
        keep = steps_to_keep(
            steps,
            latest_step,
            keep_last=config.keep_last,
            keep_best=config.keep_best,
            scores=scores,
            mode=config.best_mode,
        )
        keep |= set(config.pinned)
        for step in steps:
            if step not in keep and step < latest_step:
                remove_checkpoint(paths.checkpoint(step))
                pruned.checkpoints.append(step)
        steps = [s for s in steps if s not in pruned.checkpoints]
    if config.optimizer_keep_last is not None:
        for step in steps[: -config.optimizer_keep_last]:
            state = paths.checkpoint(step) / OPTIMIZER_FILE
            if step < latest_step and state.is_file():
                state.unlink()
                pruned.optimizer_states += 1
    requests = paths.dir / "requests"
    if config.requests_keep_last is not None and requests.is_dir():
        newest: dict[str, float] = {}
        for file in requests.iterdir():
            request_id = file.name.split(".", 1)[0]
            if request_id:  # temp files of an atomic write start with "."
                newest[request_id] = max(newest.get(request_id, 0.0), file.stat().st_mtime)
        old = sorted(newest, key=newest.__getitem__)[: -config.requests_keep_last]
        for request_id in old:
            for file in requests.glob(f"{request_id}.*"):
                file.unlink(missing_ok=True)
                pruned.request_files += 1
    if config.logs_keep_last is not None and logs is not None and logs.is_dir():
        files = sorted(logs.glob("*.log"), key=lambda f: f.stat().st_mtime)
        for file in files[: -config.logs_keep_last]:
            file.unlink(missing_ok=True)
            pruned.logs += 1
    if any(pruned.counts().values()):
        logger.info("retention pruned %s in %s", pruned.counts(), paths.dir)
    return pruned
