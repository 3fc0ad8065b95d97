"""Every example runs, with a tiny step budget (the transformers engine, where it can).

The gallery examples (`examples/<name>/train.py`) end with a held-out evaluation and a
reward curve; their runs must print the `result:` line and write the PNG."""

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
    "autorl_task.py": [
        "--engine",
        "vllm",
        "--inputs",
        "6",
        "--inputs-per-step",
        "1",
        "--group-size",
        "2",
        "--max-tokens",
        "16",
    ],
    "langgraph_sqlite.py": [
        "--engine",
        "vllm",
        "--questions",
        "4",
        "--questions-per-step",
        "1",
        "--group-size",
        "2",
        "--eval-questions",
        "1",
        "--eval-samples",
        "1",
        "--max-tokens",
        "24",
    ],
}
# One step of one group of two attempts, one held-out instance: a smoke run, not a result.
GALLERY_TINY = [
    "--tasks-per-step",
    "1",
    "--group-size",
    "2",
    "--eval-tasks",
    "1",
    "--eval-samples",
    "1",
]
GALLERY = {
    "email_search/train.py": [
        *GALLERY_TINY,
        "--max-turns",
        "3",
        "--max-tokens",
        "32",
        "--warmup-examples",
        "2",
        "--warmup-epochs",
        "1",
    ],
    "game_2048/train.py": [*GALLERY_TINY, "--moves", "3"],
    "tictactoe/train.py": GALLERY_TINY,
    "temporal_clue/train.py": GALLERY_TINY,
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


@pytest.mark.parametrize("script", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_example_runs(script, tmp_path):
    done = run_example(script, SMALL.get(script, []), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 1:" in done.stdout


@pytest.mark.parametrize("script", sorted(GALLERY))
def test_gallery_example_runs_and_writes_its_curve(script, tmp_path):
    done = run_example(script, GALLERY[script], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 1:" in done.stdout and "held-out before training:" in done.stdout
    if "--warmup-examples" in GALLERY[script]:
        assert "SFT warm-up: 2 demonstrations" in done.stdout, done.stdout[-2000:]
        assert "held-out after the SFT warm-up:" in done.stdout
    assert "result: reward_before=" in done.stdout
    curves = list(tmp_path.rglob("reward_curve.png"))
    assert len(curves) == 1 and curves[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
