"""Child processes that must not outlive rlcoach: ports, parent-death signals, reaping.

rlcoach starts long-lived children (the vLLM server, the torchrun training ranks) that
hold gigabytes and CPUs. A parent killed with -9 cannot stop them, so every child is
started in a session of its own with a parent-death signal, and a child that has
children of its own (vLLM's EngineCore and workers) gets a watchdog that kills its whole
process group when the parent dies. These helpers are shared by the engine and the
trainer; they import nothing heavy.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["free_port", "kill_group", "log_tail", "parent_death_signal", "watch_group"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` right now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def parent_death_signal(signum: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A pre-exec hook that makes the child get `signum` when the thread that spawned it dies.

    A server killed with -9 cannot stop its engine; without this its vLLM process would
    hold its memory (and a CPU) forever and a restarted server would start a second. The
    libc function is looked up here, in the parent: loading libraries after a fork is
    unsafe. None where there is no `prctl` (not Linux): pass it as `preexec_fn` as is.
    """
    if sys.platform != "linux":
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def hook() -> None:
        prctl(1, signum)  # PR_SET_PDEATHSIG

    return hook


# The parent-death signal reaches only the direct child (e.g. vLLM's API server); its own
# children (EngineCore, its workers) outlived a kill -9 of the API server or of `serve`
# and kept a CPU and gigabytes. So a watchdog, in a session of its own (a Ctrl-C of the
# parent does not reach it), gets SIGTERM when the parent dies and kills the child's
# whole process group.
_REAPER = """
import os, signal, sys
group, parent = int(sys.argv[1]), int(sys.argv[2])
def reap(*_):
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    os._exit(0)
signal.signal(signal.SIGTERM, reap)
if os.getppid() != parent:
    reap()
while True:
    signal.pause()
"""


def watch_group(process: subprocess.Popen[bytes]) -> subprocess.Popen[bytes] | None:
    """Start a watchdog that kills `process`'s group when this process dies (Linux only).

    `process` must lead its own session (`start_new_session=True`). Terminating the
    watchdog also kills the group, so stop it only once the group is stopped.
    """
    if sys.platform != "linux":
        return None
    return subprocess.Popen(
        [sys.executable, "-c", _REAPER, str(process.pid), str(os.getpid())],
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=parent_death_signal(signal.SIGTERM),
    )


def kill_group(process: subprocess.Popen[bytes] | None, signum: int) -> None:
    """Send `signum` to the process group `process` leads (gone already: nothing)."""
    if process is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signum)


def log_tail(path: Path, lines: int = 25) -> str:
    """The last `lines` lines of a child's log, for an error message."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log written)"
