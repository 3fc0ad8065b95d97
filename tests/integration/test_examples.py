"""Every example runs, with a tiny step budget (the transformers engine: no second vLLM)."""

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# Shrink what an example does beyond its steps, so each runs in about a minute.
# The AutoRL example needs constrained JSON decoding from its generator: vLLM, not
# transformers.
SMALL = {
    "ruler_calculator.py": ["--eval-questions", "1", "--questions", "1", "--group-size", "2"],
    "autorl_task.py": ["--engine", "vllm", "--inputs", "6", "--inputs-per-step", "1",
                       "--group-size", "2", "--max-tokens", "16"],
}


@pytest.mark.parametrize("script", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_example_runs(script, tmp_path):
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--steps", "1", "--engine", "transformers",
         "--root", str(tmp_path), *SMALL.get(script, [])],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 1:" in done.stdout
