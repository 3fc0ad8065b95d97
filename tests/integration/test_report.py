"""`rlcoach report`: the page renders in headless Chromium, charts decoded, a screenshot taken.

The run is written the way training writes it (the disk sink: run.json, trajectories per
step, metrics.jsonl), with token ids from the bundled model's real tokenizer; the report
is made by the real CLI, then Debian's `chromium` (the Makefile installs it) loads it with
a fresh profile, dumps the DOM after load and takes a screenshot, kept beside the run as
`report.png` for a person to look at.
"""

import html
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from rlcoach import BUNDLED_MODEL, SampledChoice, Trajectory, TrajectoryGroup, Verdict
from rlcoach.observe.sinks import SinkSet, rollout_metrics, run_info

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
ADD = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}


@pytest.fixture(scope="module")
def chromium():
    path = shutil.which("chromium")
    assert path, "Debian's chromium is missing; `make test` installs it (see the Makefile)"
    return path


def _chat_ids(tokenizer, messages) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def _attempt(tokenizer, answer: str, reward: float, tool: bool) -> Trajectory:
    prompt = [{"role": "user", "content": "What is 2 + 3?"}]
    messages = list(prompt)
    choices = []
    if tool:
        ask = {"role": "assistant", "content": None, "tool_calls": [ADD]}
        ids = _chat_ids(tokenizer, messages)
        sampled = tokenizer.encode(
            '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call><|im_end|>'
        )
        choices.append(
            SampledChoice(
                message=ask,
                prompt_token_ids=list(ids),
                token_ids=sampled,
                logprobs=[-0.3] * len(sampled),
                forced=[0, 1, 2, 3],  # as a forced tool choice records its envelope
                constraint="tool_choice=required",
                policy="agent@1",
                started_at=100.0,
                latency_s=0.4,
            )
        )
        messages += [ask, {"role": "tool", "tool_call_id": "c1", "content": "5"}]
        context = tokenizer.encode(
            "\n<|im_start|>user\n<tool_response>5</tool_response><|im_end|>"
            "\n<|im_start|>assistant\n"
        )
        ids = [*ids, *sampled, *context]
    else:
        ids = _chat_ids(tokenizer, messages)
    final = {"role": "assistant", "content": f"The answer is {answer}."}
    sampled = tokenizer.encode(f"The answer is {answer}.<|im_end|>")
    choices.append(
        SampledChoice(
            message=final,
            prompt_token_ids=list(ids),
            token_ids=sampled,
            logprobs=[-0.2] * len(sampled),
            policy="agent@1",
            started_at=101.0,
            latency_s=0.3,
        )
    )
    return Trajectory(
        messages=[*messages, final],
        choices=choices,
        reward=reward,
        metrics={"success": float(answer == "5")},
        metadata={"task": "add-2-3"},
        verdicts=[
            Verdict(
                judge="ruler", score=reward, explanation="correct sum" if answer == "5" else "wrong"
            )
        ],
    )


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from transformers import AutoTokenizer

    from rlcoach.models.bundled import bundled_model_path

    tokenizer = AutoTokenizer.from_pretrained(bundled_model_path())
    root = tmp_path_factory.mktemp("runs")
    sinks = SinkSet(run_info(root, "demo", "agent", BUNDLED_MODEL, {"learning_rate": 0.001}))
    for step in (1, 2, 3):
        groups = [
            TrajectoryGroup(
                [
                    _attempt(tokenizer, "5", 0.2 + 0.3 * step, True),
                    _attempt(tokenizer, "6", 0.1, False),
                    _attempt(tokenizer, "5", 0.1 * step, False),
                ]
            )
            for _ in range(2)
        ]
        sinks.log_trajectories(step, groups)
        sinks.log_metrics(
            step,
            {
                "event": "train",
                "loss": 0.1 / step,
                "kl": 0.0,
                "grad_norm": 0.4,
                "sampled_tokens": 120,
                "total_tokens": 400,
                "seconds": 7.5,
                "publish_seconds": 0.07,
                "step_seconds": 8.1,
                "mismatch_abs_mean": 0.01 * step,
                "mismatch_abs_max": 0.25,
                "mismatch_kl_k3": 2e-4,
                "mismatch_beyond_fraction": 0.004,
                **rollout_metrics(groups),
            },
        )
    sinks.close()
    return root / "demo" / "agent"


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_report_renders_in_headless_chromium(run_dir, chromium, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "rlcoach.cli", "report", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    page = run_dir / "report.html"
    assert done.stdout.strip() == f"report: {page}"
    assert not list(run_dir.glob(".report.html.*"))  # written through a temp file
    url = page.as_uri()
    common = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(
        [*common, "--dump-dom", url], capture_output=True, text=True, timeout=120
    ).stdout
    assert 'data-charts="3"' in dom  # the three PNG charts decoded in the browser
    assert dom.count("<tr>") == 4  # the header and three steps
    assert dom.count('class="traj"') == 12  # best and worst of two groups, three steps
    assert dom.count('<span class="t">') > 100  # trained tokens highlighted
    assert dom.count('<span class="f">') >= 4 * 6  # forced ones struck through (legend too)
    text = html.unescape(re.sub(r"<[^>]+>", "", dom))
    assert "mismatch |Δ| mean/max" in text and "0.0300/0.250" in text  # step 3's row
    assert "4 forced (not trained)" in text
    assert "correct sum" in text and "add(" in text and "<tool_call>" in text
    shot = run_dir / "report.png"
    subprocess.run(
        [*common, "--window-size=1280,1600", f"--screenshot={shot}", url],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert _png_size(shot) == (1280, 1600)
    from PIL import Image

    colors = Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 20)
    assert colors is not None and len(colors) > 50  # text and charts, not a blank page


def test_report_refuses_a_folder_that_is_not_a_run(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "rlcoach.cli", "report", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "is not a run folder" in done.stderr
