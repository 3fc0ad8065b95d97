"""Sinks: where a run's trajectories and metrics go, on disk always and elsewhere by choice.

Every training step produces two things worth keeping: the groups of trajectories it
trained on, and one metrics record (the trainer's stats, the rewards, timings). A `Sink`
receives both. The disk record (`JsonlSink`) is always there and is written inline:
`run.json` (project, model, base model, config) when the run opens,
`trajectories/<step>.jsonl` before each step runs (a crash mid-step loses nothing) and
one line of `metrics.jsonl` after it; it is the source of truth `rlcoach report` reads, and a
failure to write it is an error, like a failure to write a checkpoint.

Plug-in sinks (Langfuse, W&B, your own) get the same calls but can never block or fail
a step: each runs on its own thread behind a bounded queue. A full queue drops the
event; an exception is logged and the step goes on; both are counted, and the counts go
into every metrics record (`sink_errors/<name>`, `sink_dropped/<name>`), so a sink that
silently stopped working shows up in the metrics. `start` (a W&B run, a Langfuse
client) also runs on that thread. `close()` — also at interpreter exit — drains each
queue within `close_timeout_s`, then closes the sink (which flushes it).

Plug-ins are named in `SinkConfig.plugins` and found through the `rlcoach.observe.sinks` entry-
point group (the extras `[langfuse]` and `[wandb]` bring theirs), or passed as objects.
A plug-in class may declare `enabled_by_environment()`: Langfuse's is true when the
standard `LANGFUSE_PUBLIC_KEY` and `LANGFUSE_SECRET_KEY` are set, so exporting those
turns it on with no code change (`plugins={"langfuse": False}` keeps it off).
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import ConfigDict, Field

from rlcoach.config import parse_config
from rlcoach.errors import ConfigError
from rlcoach.paths import RunPaths, append_jsonl, write_text_atomic
from rlcoach.trajectory.trajectories import TrajectoryGroup, save_groups
from rlcoach.validation import Config

__all__ = [
    "ENTRY_POINT_GROUP",
    "JsonlSink",
    "RunInfo",
    "Sink",
    "SinkConfig",
    "SinkSet",
    "open_sinks",
    "rollout_metrics",
]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "rlcoach.sinks"
"""Entry-point group of plug-in sink classes (`name = "package.module:SinkClass"`)."""


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What a sink is told about the run it records."""

    project: str
    model: str
    base_model: str
    dir: Path
    """The run folder: `<root>/<project>/<model>/`."""
    config: dict[str, Any] = field(default_factory=dict)
    """The model's training config, as plain data (a W&B run's config)."""


@runtime_checkable
class Sink(Protocol):
    """A destination for a run's trajectories and metrics.

    `log_trajectories(step, groups)` comes before step `step` trains on `groups`;
    `log_metrics(step, record)` after it, with the full record that `metrics.jsonl` gets
    (`event` is `train` or `skipped`). Groups recorded by `model.log` (not trained on)
    come the same way, each group's metadata carrying its `split`, followed by a record
    whose `event` is `eval`. A plug-in's methods run on its own thread, one
    call at a time, and the groups it gets are its own copy.
    """

    name: str

    def start(self, run: RunInfo) -> None: ...

    def log_trajectories(self, step: int, groups: Sequence[TrajectoryGroup]) -> None: ...

    def log_metrics(self, step: int, metrics: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


class SinkConfig(Config):
    """Which plug-in sinks a backend opens for each model, and their limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    plugins: dict[str, dict[str, Any] | bool] = Field(default_factory=dict)
    """Plug-ins by entry-point name: options for the sink class (`{"wandb": {"mode":
    "offline"}}`), `True` for its defaults, `False` to keep it off even when its
    environment would turn it on."""
    from_environment: bool = True
    """Open installed plug-ins whose environment asks for them (Langfuse: its keys set)."""
    queue_size: int = Field(64, ge=1)
    """Events (one step's trajectories, or one metrics record) waiting per sink; more are
    dropped and counted."""
    close_timeout_s: float = Field(60.0, gt=0.0)
    """How long `close()` waits for each sink to drain and flush."""


class JsonlSink:
    """The disk record: trajectories per step and `metrics.jsonl` (always on, inline)."""

    name = "jsonl"

    def __init__(self) -> None:
        self.paths: RunPaths | None = None

    def start(self, run: RunInfo) -> None:
        self.paths = RunPaths(run.dir.parents[1], run.project, run.model)
        info = {
            "project": run.project,
            "model": run.model,
            "base_model": run.base_model,
            "config": run.config,
        }
        write_text_atomic(run.dir / "run.json", json.dumps(info, indent=2, default=str))

    def _paths(self) -> RunPaths:
        if self.paths is None:
            raise ConfigError("the JSONL sink was not started; call start(run) first")
        return self.paths

    def log_trajectories(self, step: int, groups: Sequence[TrajectoryGroup]) -> None:
        save_groups(self._paths().trajectory_file(step), groups)

    def write_lines(self, step: int, lines: Sequence[str], split: str | None = None) -> None:
        """The same file from groups already serialized (`model_dump_json`, one a line);
        with a `split`, the file of an evaluation (`trajectories/<split>/<step>.jsonl`)."""
        target = self._paths().trajectory_file(step, split=split)
        write_text_atomic(target, "".join(f"{x}\n" for x in lines))

    def log_metrics(self, step: int, metrics: Mapping[str, Any]) -> None:
        append_jsonl(self._paths().metrics, {"step": step, **metrics})

    def close(self) -> None:
        pass


_STOP = object()


class _Worker:
    """One plug-in sink on its own thread, behind a bounded queue."""

    def __init__(self, sink: Sink, run: RunInfo, queue_size: int, close_timeout_s: float) -> None:
        self.sink = sink
        self.close_timeout_s = close_timeout_s
        self.name = str(getattr(sink, "name", type(sink).__name__))
        self.run = run
        self.errors = 0
        self.dropped = 0
        self._lock = threading.Lock()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._broken = False
        self._closed = False
        self._warned_full = False
        self._thread = threading.Thread(
            target=self._loop, name=f"rlcoach-sink-{self.name}", daemon=True
        )
        self._thread.start()

    def submit(self, method: str, *args: Any) -> None:
        """Queue a call; never blocks (a full queue drops it and counts the drop)."""
        if self._closed or self._broken:
            self._count_drop()
            return
        try:
            self._queue.put_nowait((method, args))
        except queue.Full:
            self._count_drop()
            if not self._warned_full:
                self._warned_full = True
                logger.warning(
                    "sink %r is falling behind: its queue is full, so events are "
                    "dropped (and counted in sink_dropped/%s)",
                    self.name,
                    self.name,
                )

    def _count_drop(self) -> None:
        with self._lock:
            self.dropped += 1

    def _count_error(self, what: str, error: BaseException) -> None:
        with self._lock:
            self.errors += 1
            count = self.errors
        # The first errors get a traceback; later ones one line, so a dead service does not
        # flood the log of a long run.
        logger.warning(
            "sink %r failed to %s (%d errors so far): %r",
            self.name,
            what,
            count,
            error,
            exc_info=count <= 3,
        )

    def _loop(self) -> None:
        try:
            self.sink.start(self.run)
            # Registered after start, so at exit it runs before any hook the sink's own
            # library registered while starting (atexit runs last-in first-out): the queue
            # drains into a client that is still open.
            atexit.register(self._at_exit)
        except Exception as e:
            self._broken = True
            self._count_error("start", e)
        while True:
            item = self._queue.get()
            if item is _STOP:
                break
            if self._broken:
                self._count_drop()
                continue
            method, args = item
            try:
                if method == "log_trajectories":  # parsed here, off the training step
                    step, lines = args
                    args = (step, [TrajectoryGroup.model_validate_json(x) for x in lines])
                getattr(self.sink, method)(*args)
            except Exception as e:
                self._count_error(method, e)
        if not self._broken:
            try:
                self.sink.close()
            except Exception as e:
                self._count_error("close", e)

    def _at_exit(self) -> None:
        self.close(self.close_timeout_s)

    def close(self, timeout_s: float) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._at_exit)
        deadline = time.monotonic() + timeout_s
        try:
            self._queue.put(_STOP, timeout=timeout_s)
        except queue.Full:
            logger.warning("sink %r did not drain its queue within %.0f s", self.name, timeout_s)
            return
        self._thread.join(max(deadline - time.monotonic(), 0.0))
        if self._thread.is_alive():
            logger.warning(
                "sink %r did not finish within %.0f s; %d events were not sent",
                self.name,
                timeout_s,
                self._queue.qsize(),
            )


class SinkSet:
    """The disk record plus the plug-ins of one run; what the backend talks to."""

    def __init__(
        self, run: RunInfo, plugins: Sequence[Sink] = (), config: SinkConfig | None = None
    ) -> None:
        self.run = run
        self.config = config or SinkConfig()
        self.disk = JsonlSink()
        self.disk.start(run)
        self._workers = [
            _Worker(sink, run, self.config.queue_size, self.config.close_timeout_s)
            for sink in plugins
        ]
        self._closed = False
        if self._workers:  # drains at exit what the workers' own hooks (after start) did not
            atexit.register(self.close)

    @property
    def names(self) -> list[str]:
        """The plug-ins, by name (the disk record is always there and not listed)."""
        return [worker.name for worker in self._workers]

    def counters(self) -> dict[str, int]:
        """Errors and drops per plug-in, as they stand now."""
        out = {}
        for worker in self._workers:
            out[f"sink_errors/{worker.name}"] = worker.errors
            out[f"sink_dropped/{worker.name}"] = worker.dropped
        return out

    def log_trajectories(self, step: int, groups: Sequence[TrajectoryGroup]) -> None:
        """Write the groups to disk (inline, raises on failure), then queue them."""
        # Serialized once: the disk gets the lines, and each plug-in parses its own copy on
        # its thread (the caller may change its groups after the step; a deep copy here
        # cost the step ten times the disk write).
        lines = [group.model_dump_json() for group in groups]
        self.disk.write_lines(step, lines)
        for worker in self._workers:
            worker.submit("log_trajectories", step, lines)

    def mark_skipped(self, step: int) -> int:
        """The groups just logged for `step` trained nothing: move their file aside to
        `<step>-skip<k>.jsonl` (so the next attempt at `step` cannot overwrite them) and
        return `k`, this skipped attempt's number."""
        paths = self.disk._paths()
        skip = paths.skipped_attempts(step) + 1
        source = paths.trajectory_file(step)
        if source.is_file():
            os.replace(source, paths.trajectory_file(step, skip))
        return skip

    def log_evaluation(
        self, step: int, split: str, groups: Sequence[TrajectoryGroup], record: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Groups that were not trained on (`model.log`): to disk under
        `trajectories/<split>/`, to every plug-in as trajectories whose groups carry
        `metadata["split"]`, then their metrics record; returns the record."""
        lines = [
            group.model_copy(
                update={"metadata": {**group.metadata, "split": split}}
            ).model_dump_json()
            for group in groups
        ]
        self.disk.write_lines(step, lines, split)
        for worker in self._workers:
            worker.submit("log_trajectories", step, lines)
        return self.log_metrics(step, record)

    def log_metrics(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Add the sink counters and a timestamp, write the record, queue it; return it."""
        record = self.metrics_record(step, metrics)
        self.write_metrics_record(record)
        return record

    def metrics_record(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """The record `log_metrics` would write: `metrics` with the step, a timestamp and
        the sink counters (a step keeps it in its checkpoint before committing)."""
        return {"step": step, **metrics, "time": time.time(), **self.counters()}

    def write_metrics_record(self, record: Mapping[str, Any]) -> None:
        """Write a record made by `metrics_record` to disk (inline), then queue it."""
        step = int(record["step"])
        self.disk.log_metrics(step, record)
        for worker in self._workers:
            worker.submit("log_metrics", step, dict(record))

    def close(self) -> None:
        """Drain and close every plug-in (each within `close_timeout_s`)."""
        if self._closed:
            return
        self._closed = True
        for worker in self._workers:
            worker.close(self.config.close_timeout_s)
        if self._workers:
            atexit.unregister(self.close)


def _plugin_classes() -> dict[str, Any]:
    from importlib.metadata import entry_points

    return {entry.name: entry for entry in entry_points(group=ENTRY_POINT_GROUP)}


def _load(name: str, entry: Any) -> Any:
    try:
        return entry.load()
    except Exception as e:
        raise ConfigError(
            f"sink plug-in {name!r} could not be loaded ({e!r}); fix: install "
            f"its extra, e.g. pip install 'rlcoach[{name}]'"
        ) from e


def _wanted_by_environment(name: str, entry: Any) -> bool:
    try:
        cls = entry.load()
        check = getattr(cls, "enabled_by_environment", None)
        return bool(check()) if callable(check) else False
    except Exception as e:  # a broken plug-in must not stop training
        logger.warning("skipping sink plug-in %r: %r", name, e)
        return False


def resolve_sinks(
    value: SinkConfig | Mapping[str, Any] | Sequence[Any] | None,
) -> tuple[SinkConfig, list[Sink]]:
    """Split `LocalBackend(sinks=...)` into a config and sink objects.

    Accepts a `SinkConfig`, its dict form, or a list of plug-in names and `Sink` objects.
    """
    if value is None or isinstance(value, SinkConfig | Mapping):
        return parse_config(SinkConfig, value), []  # type: ignore[arg-type]
    if isinstance(value, str):
        value = [value]
    names: dict[str, dict[str, Any] | bool] = {}
    objects: list[Sink] = []
    for item in value:
        if isinstance(item, str):
            names[item] = True
        elif isinstance(item, Sink):
            objects.append(item)
        else:
            raise ConfigError(
                f"sinks entry {item!r} is neither a plug-in name nor a Sink (an object with "
                "name, start, log_trajectories, log_metrics and close); fix: pass e.g. "
                "sinks=['wandb'] or sinks=[MySink()]"
            )
    return SinkConfig(plugins=names), objects


def open_sinks(run: RunInfo, config: SinkConfig, objects: Sequence[Sink] = ()) -> SinkSet:
    """The `SinkSet` for one run: the disk record, the configured and wanted plug-ins."""
    available = _plugin_classes()
    plugins: list[Sink] = list(objects)
    for name, options in config.plugins.items():
        if options is False:
            continue
        if name not in available:
            known = ", ".join(sorted(available)) or "none installed"
            raise ConfigError(
                f"sink plug-in {name!r} is not installed (installed: {known}); fix: pip "
                f"install 'rlcoach[{name}]', or remove it from the sinks config"
            )
        cls = _load(name, available[name])
        plugins.append(cls(**(options if isinstance(options, dict) else {})))
    if config.from_environment:
        for name, entry in sorted(available.items()):
            if name not in config.plugins and _wanted_by_environment(name, entry):
                logger.info("sink %r is on: its environment variables are set", name)
                plugins.append(entry.load()())
    return SinkSet(run, plugins, config)


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def rollout_metrics(groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
    """A step's rollout numbers: rewards, failures, and each trajectory metric's mean.

    `rollout/<name>` is the mean of `Trajectory.metrics[name]` over the trajectories that
    have it; `group/<key>` sums a numeric group metadata value (e.g. a judge's usage).
    """
    trajectories = [t for g in groups for t in g.trajectories]
    out: dict[str, float] = {
        "rollouts": float(len(trajectories)),
        "rollout_failures": float(sum(len(g.failures) for g in groups)),
    }
    if trajectories:
        rewards = [t.reward for t in trajectories]
        out["reward_mean"], out["reward_std"] = _mean_std(rewards)
        out["reward_min"], out["reward_max"] = min(rewards), max(rewards)
    per_metric: dict[str, list[float]] = {}
    for trajectory in trajectories:
        for key, value in trajectory.metrics.items():
            per_metric.setdefault(key, []).append(float(value))
    for key, values in sorted(per_metric.items()):
        out[f"rollout/{key}"] = sum(values) / len(values)
    for group in groups:
        for key, entry in group.metadata.items():
            if isinstance(entry, int | float) and not isinstance(entry, bool):
                out[f"group/{key}"] = out.get(f"group/{key}", 0.0) + float(entry)
    return out


def run_info(
    root: str | os.PathLike[str], project: str, model: str, base_model: str, config: dict[str, Any]
) -> RunInfo:
    """A `RunInfo` for the run folder `<root>/<project>/<model>/`."""
    return RunInfo(project, model, base_model, RunPaths(root, project, model).dir, config)
