"""Failpoints: named places of a training step where a fault can be injected on purpose.

A crash at an exact point of a step (after the optimizer step, between the checkpoint's
rename and its commit, after the commit) cannot be hit from outside by timing a
`kill -9`, nor can a write that fails at one exact file. So the step calls
`failpoint("<name>")` at each such point, and the fault tests and the soak arm a point
by a file in a folder the environment names:

    RLCOACH_FAILPOINT_DIR=/some/folder      # set when the process starts (children inherit it)
    echo kill  > /some/folder/step.published    # SIGKILL the process there
    echo raise > /some/folder/step.published    # or raise OSError(EIO) there

A value can be poisoned the same way: `echo "nan 2" > /some/folder/update.loss` makes
the loss of the 2nd optimizer update of this process NaN before it is checked
(trainer/step.py, `finite_update`: RL mini-batches and SFT batches alike; in training
ranks before the loss is summed over them, so every rank skips), once (`nan 1`: the 1st).

The first process that reaches an armed point takes its file (a rename: exactly one
process fires it) and acts, so a server restarted after a crash, or the retry of a failed
request, goes on. Without the variable (the normal case) `failpoint` is one dictionary
lookup. Children inherit the variable, so a point in the engine's process
(`engine.load_adapter`) is armed in the same folder.
"""

from __future__ import annotations

import errno
import math
import os
import signal
from pathlib import Path

__all__ = ["POINTS", "arm", "failpoint", "poison"]

FOLDER_VARIABLE = "RLCOACH_FAILPOINT_DIR"

POINTS = (
    "step.trained",
    "checkpoint.renamed",
    "step.published",
    "step.committed",
    "engine.load_adapter",
    "update.loss",
)
"""Every failpoint, in the order a step reaches them: after the optimizer step, after the
checkpoint folder is in place (not yet committed), after the adapter is published and
the optimizer state written, after the commit (before the server records the result),
and the engine process's adapter load."""

ACTIONS = ("kill", "raise", "nan")


_reached: dict[str, int] = {}
"""How often this process reached each poisoned point (`poison`)."""


def arm(folder: str | os.PathLike[str], name: str, action: str = "kill", at: int = 1) -> Path:
    """Arm point `name` once in `folder` (the process's $RLCOACH_FAILPOINT_DIR); `at`:
    the reach that fires a `nan` (1: the first)."""
    if name not in POINTS or action not in ACTIONS:
        raise ValueError(f"failpoint {name!r} / action {action!r}: use one of {POINTS} / {ACTIONS}")
    path = Path(folder) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{action} {at}" if action == "nan" else action)
    return path


def poison(name: str, value: float) -> float:
    """`value`, or NaN where point `name` is armed with `nan` and this is the reach it
    names (see the module)."""
    folder = os.environ.get(FOLDER_VARIABLE)
    if not folder:
        return value
    armed = Path(folder) / name
    try:
        action, _, at = armed.read_text().strip().partition(" ")
    except OSError:
        return value
    reached = _reached[name] = _reached.get(name, 0) + 1
    if action != "nan" or reached < int(at or 1):
        return value
    try:
        os.rename(armed, armed.with_name(f".{name}.fired-{os.getpid()}"))
    except OSError:
        return value
    _reached.pop(name, None)
    return math.nan


def failpoint(name: str) -> None:
    """Act here if point `name` is armed (see the module): SIGKILL or raise OSError."""
    folder = os.environ.get(FOLDER_VARIABLE)
    if not folder:
        return
    armed = Path(folder) / name
    taken = armed.with_name(f".{name}.fired-{os.getpid()}")
    try:
        os.rename(armed, taken)  # atomic: one process takes it
    except OSError:
        return
    action = taken.read_text().strip()
    if action == "raise":
        raise OSError(errno.EIO, f"failpoint {name} (armed in {folder})")
    os.kill(os.getpid(), signal.SIGKILL)
