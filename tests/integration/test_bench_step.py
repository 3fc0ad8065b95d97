"""bench/gpu/step.py end to end on the CPU (`--tiny`): the same code the GPU run uses,
with a tiny random-weight Qwen3 shape, the transformers engine and tiny sizes (~25 s).

The colocated mode is refused here (no sleep mode on a CPU), which the table must say.
TRL's side is left out (CI has no TRL; with TRL installed, `python bench/gpu/step.py
--tiny` runs it too, generating with transformers)."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parents[2] / "bench" / "gpu" / "step.py"


def test_the_step_benchmark_runs_every_mode_on_a_cpu(tmp_path):
    done = subprocess.run(
        [sys.executable, str(BENCH), "--tiny", "--modes=sync,async,colocated", f"--out={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "step.json").read_text())
    assert results["sync"]["lags"] == [0, 0, 0]
    assert results["async"]["lags"] == [0, 1, 1]
    for mode in ("sync", "async"):
        assert results[mode]["steps_per_hour"] > 0 and not results[mode]["failed"]
        assert results[mode]["completion_tokens"] == 8
        assert abs(sum(p["share"] for p in results[mode]["phases"].values()) - 1.0) < 1e-6
    assert "colocation='sleep'" in results["colocated"]["refused"]
    assert "fix: " in results["colocated"]["refused"]
    assert "ratios of RL steps per hour: async/sync" in done.stdout
    assert "|" in done.stdout and "sync " in done.stdout
