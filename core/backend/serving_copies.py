"""The engine's copies of published adapters: written to memory, not synced to disk.

A step is published from a serving copy of its adapter (step_commit.py): the adapter in
the dtype the engine serves (the trainer's `save_adapter(..., serving=True)`), written
into a RAM-backed folder (`/dev/shm`) with no fsync, so the engine loads it while the
durable checkpoint is still being written and synced beside it. Once the step is
committed, the router loads the step from its checkpoint folder for any later load
(`Router.relocate`); the serving copy stays until the engine unloads that adapter (the
engine may read its file again until then) and is deleted then (`drop`, the router's
`on_unload`), or at once when the publish fails before the engine loaded it. So about
`max_loras` copies exist at once, and `close` removes the rest.

Where `/dev/shm` is missing or too small (a container's default is 64 MiB), the copies
go to a folder beside the run's checkpoints instead: still no fsync, so the page cache
holds them.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = ["ServingCopies"]

logger = logging.getLogger(__name__)

RAM_FOLDER = Path("/dev/shm")
PREFIX = "rlcoach-serving-"


class ServingCopies:
    """A folder of adapters written for the engine alone, one per served name."""

    def __init__(self, ram: Path = RAM_FOLDER) -> None:
        self._ram = ram
        self._roots: dict[Path, Path] = {}
        """Run folder -> the folder of its serving copies (made on first use)."""
        self._copies: set[Path] = set()
        self._lock = threading.Lock()
        remove_orphans(ram)

    def write(
        self, served: str, save: Callable[[Path], None], fallback: Path, size_hint: int
    ) -> Path:
        """A new copy of `served`'s adapter, written by `save(folder)`: in RAM when it
        has twice `size_hint` bytes free, else (or when the RAM write fails) under
        `fallback`."""
        try:
            return self._write(served, save, self._root(fallback, size_hint, ram=True))
        except OSError as e:
            logger.warning(
                "serving copy of %s not written in RAM (%r); using %s", served, e, fallback
            )
        return self._write(served, save, self._root(fallback, size_hint, ram=False))

    def _write(self, served: str, save: Callable[[Path], None], root: Path) -> Path:
        folder = Path(tempfile.mkdtemp(prefix=served.replace("/", "_") + "-", dir=root))
        try:
            save(folder)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        with self._lock:
            self._copies.add(folder)
        return folder

    def drop(self, folder: Path) -> None:
        """Delete the copy in `folder` once the engine no longer holds it (a folder that
        is not a copy, a checkpoint, is left alone)."""
        with self._lock:
            if folder not in self._copies:
                return
            self._copies.discard(folder)
        shutil.rmtree(folder, ignore_errors=True)

    def close(self) -> None:
        with self._lock:
            roots, self._roots, self._copies = list(self._roots.values()), {}, set()
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)

    def _root(self, fallback: Path, size_hint: int, ram: bool) -> Path:
        with self._lock:
            key = self._ram if ram and in_ram_with_room(self._ram, size_hint) else fallback
            if key not in self._roots:
                key.mkdir(parents=True, exist_ok=True)
                prefix = f"{PREFIX}{os.getpid()}-"
                self._roots[key] = Path(tempfile.mkdtemp(prefix=prefix, dir=key))
            return self._roots[key]


def in_ram_with_room(ram: Path, size_hint: int) -> bool:
    try:
        return ram.is_dir() and shutil.disk_usage(ram).free >= 2 * size_hint
    except OSError:
        return False


def remove_orphans(ram: Path) -> None:
    """Delete serving copies left in RAM by processes that died without `close`."""
    try:
        leftovers = list(ram.glob(f"{PREFIX}*"))
    except OSError:
        return
    for folder in leftovers:
        pid = folder.name[len(PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not alive(int(pid)):
            logger.info("removing serving copies of a finished process: %s", folder)
            shutil.rmtree(folder, ignore_errors=True)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
