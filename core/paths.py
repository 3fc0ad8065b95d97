"""Where a run lives on disk, and how files get there atomically.

`<root>/<project>/<model>/` holds `checkpoints/<step>/` (peft adapters), `trajectories/
<step>.jsonl` (the groups trained on at that step) and `metrics.jsonl`. The root
defaults to `.rlcoach/` in the working directory. Every write goes to a temporary name in
the same folder and is renamed into place, so a crash never leaves a partial file or
checkpoint where a reader would take it for a complete one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

__all__ = [
    "UNCOMMITTED",
    "RunPaths",
    "append_jsonl",
    "fsync_dir",
    "fsync_tree",
    "is_checkpoint",
    "write_text_atomic",
]

DEFAULT_ROOT = Path(".rlcoach")

UNCOMMITTED = ".uncommitted"
"""A file in a checkpoint folder whose step is not (yet) the model's: written before the
folder is renamed into place, removed when the step commits (backend.py). A folder that
still has it after a crash or a failed step is not a checkpoint and is removed."""


def is_checkpoint(folder: Path) -> bool:
    """Whether `folder` is a complete, committed checkpoint (`<step>/` with an adapter)."""
    return (
        folder.name.isdigit()
        and (folder / "adapter_config.json").is_file()
        and not (folder / UNCOMMITTED).exists()
    )


class RunPaths:
    """The folders of one trainable model."""

    def __init__(self, root: str | os.PathLike[str], project: str, model: str) -> None:
        self.root = Path(root)
        self.dir = self.root / project / model
        self.checkpoints = self.dir / "checkpoints"
        self.trajectories = self.dir / "trajectories"
        self.metrics = self.dir / "metrics.jsonl"

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"{step:06d}"

    def trajectory_file(self, step: int, skip: int = 0, split: str | None = None) -> Path:
        """The groups trained at `step`; `skip` > 0: those of its `skip`-th attempt that
        trained nothing (no group had reward variance), kept beside it; with a `split`,
        the groups `model.log` recorded for that split at `step`
        (`trajectories/<split>/<step>.jsonl`)."""
        suffix = f"-skip{skip}" if skip else ""
        folder = self.trajectories / split if split else self.trajectories
        return folder / f"{step:06d}{suffix}.jsonl"

    def skipped_attempts(self, step: int) -> int:
        """How many attempts at `step` were skipped so far (their files are on disk)."""
        if not self.trajectories.is_dir():
            return 0
        return len(list(self.trajectories.glob(f"{step:06d}-skip*.jsonl")))

    def complete_checkpoints(self) -> dict[int, Path]:
        """Every complete, committed checkpoint by step (see `is_checkpoint`)."""
        if not self.checkpoints.is_dir():
            return {}
        return {int(e.name): e for e in self.checkpoints.iterdir() if is_checkpoint(e)}

    def latest_checkpoint(self) -> tuple[int, Path] | None:
        """The highest complete checkpoint; temp folders of a crashed save and folders of
        a step that never committed are skipped."""
        steps = self.complete_checkpoints()
        return max(steps.items()) if steps else None

    def remove_partial_checkpoints(self) -> list[Path]:
        """Delete temp folders left by a save that was killed, and folders of a step that
        never committed (`UNCOMMITTED`); return what was removed."""
        removed = []
        if self.checkpoints.is_dir():
            for entry in self.checkpoints.iterdir():
                if entry.name.startswith(".tmp-") or (entry / UNCOMMITTED).exists():
                    shutil.rmtree(entry, ignore_errors=True)
                    removed.append(entry)
        return removed

    def temp_checkpoint(self) -> Path:
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.checkpoints))


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write `text` to `path` through a temp file and a rename."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def append_jsonl(path: str | os.PathLike[str], record: dict[str, Any]) -> None:
    """Append one JSON line (a single write, flushed, so a reader never sees half). A
    last line torn by a crash (no newline) is ended first, so it cannot swallow this one."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record, sort_keys=True) + "\n"
    with open(target, "a+b") as handle:
        if handle.tell() > 0:
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) != b"\n":
                line = "\n" + line
        handle.write(line.encode("utf-8"))
        handle.flush()
        os.fsync(handle.fileno())


def fsync_dir(folder: str | os.PathLike[str]) -> None:
    """Flush a folder's entries (a rename into it, a file made in it) to the disk."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: str | os.PathLike[str]) -> None:
    """Flush every file under `folder`, and the folders themselves, to the disk: a
    checkpoint renamed into place after this survives a power cut whole."""
    root = Path(folder)
    for path in sorted(root.rglob("*"), reverse=True):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
        elif path.is_dir():
            fsync_dir(path)
    fsync_dir(root)
