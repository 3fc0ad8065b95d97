"""The process's heap after a training step: freed memory handed back, and a debug log.

A server that trains for days must not grow step after step. After each step
`LocalBackend` collects garbage (a step's reference cycles, such as a failed step's
traceback holding its frames' tensors, would otherwise wait for a full collection, which
a large heap rarely triggers) and asks glibc to hand free pages back to the system
(`malloc_trim`). Measured: the soak's server held ~60 MiB more RSS without the trim
(docs/faults.md), the test suite's process without either grew past 16 GB and was
killed, and the two cost ~0.33 s a step with the bundled model loaded (collect 0.18 s,
trim 0.15 s on a 2-core CPU).

With `$RLCOACH_HEAP_LOG=<file>` each step also appends one JSON line there: RSS, glibc's
own account of its heap (`mallinfo2`: bytes in use, bytes free but kept in its arenas,
mmapped bytes), and, when Python's `tracemalloc` runs (`PYTHONTRACEMALLOC=1`), the bytes
Python objects hold and every 10 steps a snapshot beside the log. Comparing the lines of
two steps tells a leak (bytes in use, or Python's, grow) from allocator high water (free
bytes kept in arenas grow, in-use bytes do not). It is a debugging aid; off by default.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

__all__ = ["LOG_VARIABLE", "after_step", "heap_figures"]

LOG_VARIABLE = "RLCOACH_HEAP_LOG"

_steps = 0


class _MallInfo2(ctypes.Structure):
    """glibc's `struct mallinfo2` (glibc >= 2.33)."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _libc() -> Any:
    return ctypes.CDLL("libc.so.6") if sys.platform.startswith("linux") else None


def heap_figures() -> dict[str, float]:
    """RSS and glibc's heap in MiB (empty where unknown: not Linux, or an old glibc)."""
    figures: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                figures["rss_mib"] = int(line.split()[1]) / 1024
    libc = _libc()
    with contextlib.suppress(OSError, AttributeError):
        if libc is not None:
            libc.mallinfo2.restype = _MallInfo2
            info = libc.mallinfo2()
            mib = 1024 * 1024
            figures["malloc_in_use_mib"] = info.uordblks / mib
            figures["malloc_free_kept_mib"] = info.fordblks / mib
            figures["malloc_mmapped_mib"] = info.hblkhd / mib
            figures["malloc_arena_mib"] = info.arena / mib
    if tracemalloc.is_tracing():
        figures["python_traced_mib"] = tracemalloc.get_traced_memory()[0] / (1024 * 1024)
    return figures


def after_step() -> None:
    """Collect garbage, hand free heap pages back to the system, and (with
    `$RLCOACH_HEAP_LOG`) log the heap (see the module)."""
    global _steps
    _steps += 1
    gc.collect()
    libc = _libc()
    if libc is not None:
        with contextlib.suppress(OSError, AttributeError):
            libc.malloc_trim(0)
    log = os.environ.get(LOG_VARIABLE)
    if not log:
        return
    with contextlib.suppress(OSError):
        record = {"steps": _steps, "pid": os.getpid(), "time": time.time(), **heap_figures()}
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        if tracemalloc.is_tracing() and _steps % 10 == 0:
            tracemalloc.take_snapshot().dump(f"{log}.{os.getpid()}.{_steps:05d}.snapshot")
