"""Every example runs, with a tiny step budget (the transformers engine, where it can)."""

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# Shrink what an example does beyond its steps, so each runs in about a minute.
# The AutoRL and LangGraph examples need constrained JSON decoding from their generator:
# vLLM, not transformers.
SMALL = {
    "ruler_calculator.py": ["--eval-questions", "1", "--questions", "1", "--group-size", "2"],
    "autorl_task.py": ["--engine", "vllm", "--inputs", "6", "--inputs-per-step", "1",
                       "--group-size", "2", "--max-tokens", "16"],
    "langgraph_sqlite.py": ["--engine", "vllm", "--questions", "4", "--questions-per-step",
                            "1", "--group-size", "2", "--eval-questions", "1",
                            "--eval-samples", "1", "--max-tokens", "24"],
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
