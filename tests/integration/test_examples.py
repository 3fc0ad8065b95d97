"""Every example runs, once, with a tiny step budget.

An example that needs vLLM, and every gallery example, runs unchanged through `rlcoach
serve` on vLLM (test_serve_vllm.py, one vLLM for all of them); `ruler_calculator.py` runs
through `rlcoach serve` on the transformers engine (test_serve.py). The rest run here with
a LocalBackend on the transformers engine. Running each example both ways would only
repeat the same code path at the cost of a process start and a model load."""

import subprocess
import sys
from pathlib import Path

import pytest
from test_serve import THROUGH_SERVE as THROUGH_SERVE_TRANSFORMERS
from test_serve_vllm import THROUGH_SERVE as THROUGH_SERVE_VLLM

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ELSEWHERE = set(THROUGH_SERVE_VLLM) | set(THROUGH_SERVE_TRANSFORMERS)
LOCAL = sorted(
    str(p.relative_to(EXAMPLES))
    for p in [*EXAMPLES.glob("*.py"), *EXAMPLES.glob("*/train.py")]
    if str(p.relative_to(EXAMPLES)) not in ELSEWHERE
)


# Shrink what an example does beyond its one step, so each runs in well under a minute.
SMALL = {
    "gemma3_base/train.py": [
        "--held-out",
        "1",
        "--eval-samples",
        "1",
        "--demonstrations",
        "2",
        "--sft-epochs",
        "1",
        "--per-step",
        "1",
        "--group-size",
        "2",
        "--max-tokens",
        "4",
    ],
}


def run_example(script: str, args: list[str], root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / script),
            "--steps",
            "1",
            "--engine",
            "transformers",
            "--root",
            str(root),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_every_example_is_run_by_some_test():
    scripts = {str(p.relative_to(EXAMPLES)) for p in EXAMPLES.glob("*.py")}
    scripts |= {str(p.relative_to(EXAMPLES)) for p in EXAMPLES.glob("*/train.py")}
    assert scripts == set(LOCAL) | ELSEWHERE


@pytest.mark.parametrize("script", LOCAL)
def test_example_runs(script, tmp_path):
    done = run_example(script, SMALL.get(script, []), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 1" in done.stdout
