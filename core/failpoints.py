"""Failpoints: named places where a process kills itself, for the fault tests and the soak.

A crash at an exact point of a step (after the optimizer step, halfway through writing
a checkpoint, between its rename and its publish) cannot be hit from outside by timing
a `kill -9`. So the step calls `failpoint("<name>")` at each such point, and the process
sends itself SIGKILL there when the environment asks for it:

    RLCOACH_FAILPOINT=checkpoint.renamed,engine.load_adapter   points, comma-separated
    RLCOACH_FAILPOINT_DIR=/some/folder                         optional: each point once

With `RLCOACH_FAILPOINT_DIR` set, a point fires only for the first process that reaches
it (it leaves a file named after the point in that folder), so a server restarted with
the same environment — or an engine restarted by its supervisor — goes on. Unset (the
normal case), `failpoint` is one dictionary lookup. Children inherit the variables, so
a point in the engine's process is armed by the same line as one in `rlcoach serve`.

The points (`POINTS`) are the steps of a training step in `LocalBackend` (commit.py has
the order) and one in the transformers engine process.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

__all__ = ["POINTS", "failpoint"]

VARIABLE = "RLCOACH_FAILPOINT"
ONCE_VARIABLE = "RLCOACH_FAILPOINT_DIR"

POINTS = (
    "step.trained",
    "checkpoint.adapter_written",
    "checkpoint.written",
    "checkpoint.renamed",
    "step.published",
    "engine.load_adapter",
)
"""Every failpoint, in the order a step reaches them (the last: in the engine process)."""


def failpoint(name: str) -> None:
    """SIGKILL this process here if $RLCOACH_FAILPOINT names `name` (see the module)."""
    armed = os.environ.get(VARIABLE)
    if not armed or name not in armed.split(","):
        return
    once = os.environ.get(ONCE_VARIABLE)
    if once:
        try:
            Path(once).mkdir(parents=True, exist_ok=True)
            os.close(os.open(Path(once) / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return  # fired already, by this process or one before it
    os.kill(os.getpid(), signal.SIGKILL)
