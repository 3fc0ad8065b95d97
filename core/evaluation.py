"""Evaluation records, and which checkpoints to keep by them.

`model.log(groups, split="val")` records groups that are not trained on — a validation
or test set, or a comparison model's attempts — with their numbers, at the model's
current step: the groups go to `trajectories/<split>/<step>.jsonl` and to every plug-in
sink (each group's metadata carries `split`), and one `metrics.jsonl` record with
`event: "eval"` carries `<split>/reward` (the mean, as ART names it), `<split>/reward_std`,
min and max, rollouts and failures, and `<split>/<metric>` for each trajectory metric's
mean. `rlcoach report` charts them beside the training curves.

`model.delete_checkpoints("val/reward")` then keeps the latest checkpoint (always), the
`keep_last` newest, and the `keep_best` best by that metric — any number in the run's
`metrics.jsonl` records (an eval metric, or a training one such as `reward_mean`) — and
deletes the rest. `steps_to_keep` is the pure rule, so `rlcoach serve`'s retention can
apply the same one.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from rlcoach.errors import ConfigError
from rlcoach.paths import RunPaths
from rlcoach.sinks import rollout_metrics
from rlcoach.types import Trajectory, TrajectoryGroup

__all__ = [
    "as_groups",
    "check_split",
    "delete_checkpoints",
    "eval_record",
    "metric_by_step",
    "read_metric",
    "steps_to_keep",
]

logger = logging.getLogger(__name__)

_SPLIT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def check_split(split: str) -> str:
    """A split name is one safe path component (it names a folder of trajectories)."""
    if not isinstance(split, str) or not _SPLIT.match(split):
        raise ConfigError(
            f"split {split!r} is not a usable split name: it names the folder "
            "trajectories/<split>/ and prefixes the metrics; fix: use letters, digits, '_' "
            "or '-' (e.g. 'val', 'test')"
        )
    return split


def as_groups(items: Iterable[Any]) -> list[TrajectoryGroup]:
    """Trajectories (and exceptions) as one group, or groups as they are (ART's `log`)."""
    items = list(items)
    if any(isinstance(x, Trajectory | BaseException) for x in items):
        return [TrajectoryGroup(items)]
    groups = []
    for item in items:
        if not isinstance(item, TrajectoryGroup):
            raise ConfigError(
                f"model.log got a {type(item).__name__}; fix: pass trajectories or "
                "trajectory groups (e.g. the result of gather_trajectory_groups)"
            )
        if item.pending:
            raise ConfigError(
                "model.log got a TrajectoryGroup whose rollouts have not run; fix: pass the "
                "groups that `await gather_trajectory_groups(...)` returns"
            )
        groups.append(item)
    return groups


def eval_record(
    groups: Sequence[TrajectoryGroup], split: str, metrics: Mapping[str, float] | None = None
) -> dict[str, Any]:
    """The `metrics.jsonl` record of an evaluation (see the module docstring)."""
    numbers = rollout_metrics(groups)
    record: dict[str, Any] = {"event": "eval", "split": split}
    renamed = {
        "reward_mean": "reward",
        "rollouts": "rollouts",
        "rollout_failures": "rollout_failures",
    }
    for key, value in numbers.items():
        if key.startswith("rollout/"):
            record[f"{split}/{key.removeprefix('rollout/')}"] = value
        elif key.startswith("group/"):
            record[f"{split}/{key}"] = value
        else:
            record[f"{split}/{renamed.get(key, key)}"] = value
    for key, value in (metrics or {}).items():
        record[key if "/" in key else f"{split}/{key}"] = value
    return record


def read_metric(metrics_file: Path, metric: str) -> dict[int, float]:
    """`metric`'s value per step in a run's `metrics.jsonl` (torn lines are skipped)."""
    if not metrics_file.is_file():
        return {}
    records = []
    for line in metrics_file.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return metric_by_step(records, metric)


def metric_by_step(records: Iterable[Any], metric: str) -> dict[int, float]:
    """`metric`'s value per step in metrics records (the mean where a step has several;
    records without a finite number for it are skipped)."""
    values: dict[int, list[float]] = {}
    for record in records:
        if not isinstance(record, dict):
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


def steps_to_keep(
    steps: Iterable[int],
    latest: int,
    *,
    keep_last: int = 1,
    keep_best: int = 1,
    scores: Mapping[int, float] | None = None,
    mode: Literal["max", "min"] = "max",
) -> set[int]:
    """The checkpoint steps a retention rule keeps: `latest` always, the `keep_last`
    newest, and the `keep_best` best by `scores` (among existing checkpoints)."""
    if keep_last < 1 or keep_best < 0:
        raise ConfigError(
            f"keep_last={keep_last!r} must be at least 1 and keep_best={keep_best!r} at "
            "least 0; fix: e.g. keep_last=1, keep_best=1 (the latest and the best)"
        )
    if mode not in ("max", "min"):
        raise ConfigError(f"best_mode={mode!r} must be 'max' or 'min'")
    existing = sorted(set(steps))
    keep = set(existing[-keep_last:]) | {latest}
    ranked = sorted(
        (s for s in existing if scores and s in scores),
        key=lambda s: (scores or {})[s],
        reverse=mode == "max",
    )
    return keep | set(ranked[:keep_best])


def _remove(folder: Path) -> None:
    # Renamed to a `.tmp-` name first (a restart removes those), so a crash mid-delete
    # never leaves a half folder that looks like a complete checkpoint.
    doomed = folder.with_name(f".tmp-deleting-{folder.name}")
    os.replace(folder, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def delete_checkpoints(
    paths: RunPaths,
    latest: int,
    best_checkpoint_metric: str,
    *,
    keep_last: int = 1,
    keep_best: int = 1,
    best_mode: Literal["max", "min"] = "max",
    forget: Callable[[int], None] = lambda step: None,
) -> list[int]:
    """Delete a run's checkpoints that `steps_to_keep` does not keep; `forget(step)` is
    called before each goes (the router stops serving it). Returns the deleted steps."""
    steps = [
        int(p.name)
        for p in (paths.checkpoints.iterdir() if paths.checkpoints.is_dir() else [])
        if p.name.isdigit() and (p / "adapter_config.json").exists()
    ]
    scores = read_metric(paths.metrics, best_checkpoint_metric)
    if keep_best and steps and not scores:
        logger.warning(
            "no %r in %s yet: keeping only the newest checkpoints (record it with "
            "model.log(groups, split=...) or name another metric)",
            best_checkpoint_metric,
            paths.metrics,
        )
    keep = steps_to_keep(
        steps, latest, keep_last=keep_last, keep_best=keep_best, scores=scores, mode=best_mode
    )
    deleted = sorted(s for s in steps if s not in keep)
    for step in deleted:
        forget(step)
        _remove(paths.checkpoint(step))
    if deleted:
        logger.info("deleted checkpoints %s of %s (kept %s)", deleted, paths.dir, sorted(keep))
    return deleted
