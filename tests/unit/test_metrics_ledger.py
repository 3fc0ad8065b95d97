"""`MetricsLedger` (core/backend/step_commit.py) on checkpoint folders laid out on disk as a step
commits them: each committed step's line in metrics.jsonl exactly once, whatever failed
between the commit and the line. (The same through real steps and a real kill -9:
test_step_commit.py and test_serve_faults.py.)"""

import json
import os

import pytest

from rlcoach.backend.step_commit import METRICS_RECORD, MetricsLedger
from rlcoach.paths import UNCOMMITTED, RunPaths, append_jsonl


def _commit(paths: RunPaths, step: int, committed: bool = True) -> dict:
    """A checkpoint folder as `commit_step` leaves it (only the files the ledger reads)."""
    folder = paths.checkpoint(step)
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{}")
    record = {"step": step, "event": "train", "loss": step / 10, "time": 1000.0 + step}
    (folder / METRICS_RECORD).write_text(json.dumps(record))
    if not committed:
        (folder / UNCOMMITTED).touch()
    return record


def _lines(paths: RunPaths) -> list[str]:
    return paths.metrics.read_text().splitlines()


def test_every_committed_step_gets_its_line_once(tmp_path):
    paths = RunPaths(tmp_path, "p", "m")
    failures = [OSError(28, "No space left on device")]

    def write(record: dict) -> None:
        if record["step"] == 3 and failures:
            raise failures.pop()
        append_jsonl(paths.metrics, record)

    ledger = MetricsLedger(paths, write)
    first = _commit(paths, 1)
    append_jsonl(paths.metrics, first)  # written after its commit, as normal
    append_jsonl(paths.metrics, {"step": 2, "event": "skipped"})  # not a committed line
    _commit(paths, 2)  # the server died before its line
    _commit(paths, 4, committed=False)  # a step that never committed has no line
    assert ledger.sync(full=True) == [2]
    assert ledger.sync(full=True) == []  # again: nothing twice
    _commit(paths, 3)
    with pytest.raises(OSError, match="No space"):
        ledger.sync(upto=3)  # the disk is full: the line is not written...
    os.remove(paths.checkpoint(4) / UNCOMMITTED)  # (4 commits later)
    assert ledger.sync(upto=4) == [3, 4]  # ...until the next commit
    steps = [json.loads(line)["step"] for line in _lines(paths)]
    assert steps == [1, 2, 2, 3, 4]  # the skipped attempt's line, then each step once
    assert json.loads(_lines(paths)[2]) == json.loads(
        (paths.checkpoint(2) / METRICS_RECORD).read_text()
    )
    assert MetricsLedger(paths, write).sync(full=True) == []  # a restart adds nothing
