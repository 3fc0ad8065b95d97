"""The after-step heap log (core/runtime/heap.py) that the soak reads: one line per step with RSS
and glibc's own account of its heap, in this very process."""

import json
import sys

import pytest

from rlcoach.runtime.heap import LOG_VARIABLE, after_step


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and glibc")
def test_each_step_logs_rss_and_what_glibc_holds_in_use(tmp_path, monkeypatch):
    log = tmp_path / "heap.jsonl"
    after_step()  # without the variable: nothing is written
    assert not log.exists()
    monkeypatch.setenv(LOG_VARIABLE, str(log))
    after_step()
    kept = [bytes([i]) * (1 << 20) for i in range(64)]  # 64 MiB written, kept in use
    after_step()
    first, second = (json.loads(line) for line in log.read_text().splitlines())
    assert second["steps"] == first["steps"] + 1
    assert second["malloc_in_use_mib"] - first["malloc_in_use_mib"] > 60 or (
        second["malloc_mmapped_mib"] - first["malloc_mmapped_mib"] > 60
    )
    assert second["rss_mib"] - first["rss_mib"] > 60
    del kept
