"""The shared process helpers (rlcoach.runtime.processes), on real child processes."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from rlcoach.runtime.processes import (
    free_port,
    kill_group,
    log_tail,
    parent_death_signal,
    watch_group,
)

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="prctl and /proc are Linux's")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (dead, not yet reaped by its parent) counts as gone
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_free_port_can_be_bound():
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_log_tail_keeps_the_last_lines_and_says_when_there_is_no_log(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("".join(f"line {i}\n" for i in range(40)))
    assert log_tail(log, 3) == "line 37\nline 38\nline 39"
    assert log_tail(tmp_path / "missing.log") == "(no log written)"


@linux_only
def test_kill_group_stops_a_child_and_its_children(tmp_path):
    # A shell in its own session that starts a grandchild and waits: killing the group
    # must take both (what `restart` relies on for vLLM's EngineCore and workers).
    pid_file = tmp_path / "grandchild.pid"
    leader = subprocess.Popen(
        ["sh", "-c", f"sleep 60 & echo $! > {pid_file}; wait"], start_new_session=True
    )
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline, "the grandchild did not start"
        time.sleep(0.05)
    grandchild = int(pid_file.read_text())
    kill_group(leader, signal.SIGKILL)
    leader.wait(timeout=10)
    assert _wait_gone(grandchild)
    kill_group(leader, signal.SIGKILL)  # already gone: no error


@linux_only
def test_a_child_dies_with_its_parent_and_the_watchdog_reaps_its_group(tmp_path):
    # An intermediate Python process starts a child with parent_death_signal() and a
    # watchdog for the child's group, then is killed with -9: the child (and its group)
    # must not outlive it.
    pids = tmp_path / "pids"
    code = (
        "import subprocess, sys, time\n"
        "from rlcoach.runtime.processes import parent_death_signal, watch_group\n"
        "child = subprocess.Popen(['sh', '-c', 'sleep 60 & wait'], start_new_session=True,"
        " preexec_fn=parent_death_signal())\n"
        "reaper = watch_group(child)\n"
        f"open({str(pids)!r}, 'w').write(f'{{child.pid}} {{reaper.pid}}')\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 30
    while not pids.exists() or len(pids.read_text().split()) != 2:
        assert time.monotonic() < deadline, "the parent did not start its child"
        time.sleep(0.05)
    child, reaper = (int(p) for p in pids.read_text().split())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    assert _wait_gone(child), "the child outlived its parent"
    assert _wait_gone(reaper), "the watchdog outlived its parent"


def test_watch_group_and_the_hook_are_none_off_linux(monkeypatch):
    child = subprocess.Popen(["true"])
    monkeypatch.setattr(sys, "platform", "darwin")
    assert parent_death_signal() is None
    assert watch_group(child) is None
    child.wait()
