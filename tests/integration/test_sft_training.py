"""SFT and distillation against the real vLLM policy endpoint and the bundled model.

SFT on a fixed set must lower the loss and change what the served adapter says; its
checkpoints continue the model's step numbers (resume included). Distillation runs a
user rollout with a plain `Model` as teacher (the base weights behind the same endpoint,
reached as an ordinary OpenAI-compatible server), captures its conversations client side
(streamed and not), keeps only rewarded attempts and fine-tunes a student on them.
"""

import json
import subprocess
import sys

import pytest

from rlcoach import BUNDLED_MODEL, Model, TrainableModel
from rlcoach.backend.distill import collect_demonstrations, distill
from rlcoach.trajectory.trajectories import ChatRecord

pytestmark = pytest.mark.vllm

SECRET = [
    ChatRecord(
        messages=[
            {"role": "user", "content": q},
            {"role": "assistant", "content": "The secret word is PINEAPPLE."},
        ]
    )
    for q in (
        "What is the secret word?",
        "Tell me the secret word.",
        "Which word is secret?",
        "Say the secret word.",
    )
]


async def greedy(model, question):
    client = model.openai_client(record=False)
    reply = await client.chat.completions.create(
        model=model.served_name,
        messages=[{"role": "user", "content": question}],
        temperature=0.0,
        max_tokens=16,
    )
    return reply.choices[0].message.content or ""


async def test_sft_lowers_the_loss_changes_the_served_adapter_and_keeps_step_numbers(
    vllm_backend,
):
    student = TrainableModel("sft-student", "integration")
    await student.register(vllm_backend)
    assert "PINEAPPLE" not in await greedy(student, "What is the secret word?")

    result = await student.train_sft(SECRET, {"epochs": 10, "batch_size": 4, "learning_rate": 3e-3})
    assert result.step == 1 and student.step == 1
    assert result.stats.optimizer_steps == 10 and result.stats.sequences == 4
    assert result.stats.loss_last < 0.3 * result.stats.loss_first
    assert "PINEAPPLE" in await greedy(student, "What is the secret word?")
    record = json.loads((result.checkpoint / "rlcoach_step.json").read_text())
    assert record["kind"] == "sft"
    saved = (vllm_backend.paths(student).dir / "sft" / "000001.jsonl").read_text().splitlines()
    assert len(saved) == 4

    again = await student.train_sft(SECRET[:2], {"epochs": 1})
    assert again.step == 2
    events = [
        json.loads(line)["event"]
        for line in vllm_backend.paths(student).metrics.read_text().splitlines()
    ]
    assert events.count("sft") == 2
    resumed = TrainableModel("sft-student", "integration")
    await resumed.register(vllm_backend)
    assert resumed.step == 2


async def ask_sum(model, task):
    """A user's rollout: the same code serves the teacher (plain Model) and the policy."""
    a, b, stream = task
    async with model.rollout(a=a, b=b) as rollout:
        client = model.openai_client()
        messages = [
            {"role": "system", "content": "Answer with the number only."},
            {"role": "user", "content": f"What is {a} + {b}?"},
        ]
        if stream:
            chunks = await client.chat.completions.create(
                model=model.served_name,
                messages=messages,
                max_tokens=12,
                stream=True,
                temperature=0.3,
            )
            text = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
        else:
            reply = await client.chat.completions.create(
                model=model.served_name, messages=messages, max_tokens=12, temperature=0.3
            )
            text = reply.choices[0].message.content or ""
        rollout.reward = float(str(a + b) in text)
    return rollout.trajectory


async def test_distillation_keeps_the_teachers_rewarded_attempts_and_trains(vllm_backend):
    teacher = Model(BUNDLED_MODEL, base_url=vllm_backend.url + "/v1")
    # Temperature 0.3 and 8 samples a task: at temperature 1 all 16 of 4 x 4 attempts once
    # missed (the 135M model's sums are right only some of the time).
    tasks = [(2, 3, False), (1, 1, True), (4, 4, False), (10, 5, True)]
    demos = await collect_demonstrations(
        teacher, ask_sum, tasks, samples_per_task=8, min_reward=1.0, progress=False
    )
    assert demos.attempts == 32 and not demos.failures
    for trajectory in demos.kept + demos.rejected:
        roles = [m["role"] for m in trajectory.messages]
        assert roles == ["system", "user", "assistant"]  # captured, streamed ones too
        assert not trajectory.choices  # a plain model: messages, no sampled tokens
    assert all(t.reward == 1.0 for t in demos.kept)
    assert all(t.reward < 1.0 for t in demos.rejected)
    assert demos.kept, "the base model should solve some one-digit sums"
    # the gateway kept nothing for these rollouts: they were captured client side
    assert not any(vllm_backend.gateway.recorder.take(t.id) for t in demos.kept)

    student = TrainableModel("distilled", "integration")
    await student.register(vllm_backend)
    demos, result = await distill(
        student, teacher, ask_sum, tasks[:2], samples_per_task=4, progress=False
    )
    if demos.kept:
        assert result.step == 1 and result.stats.examples == len(demos.kept)
    else:
        assert result is None and student.step == 0


def test_sft_command_trains_from_a_jsonl_file(tmp_path):
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(r.model_dump_json() + "\n" for r in SECRET))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlcoach.cli",
            "sft",
            str(data),
            "--name",
            "cli-sft",
            "--epochs",
            "2",
            "--root",
            str(tmp_path / "runs"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "sft: 4 examples, 4 sequences" in done.stdout and "cli-sft@1" in done.stdout
    assert (tmp_path / "runs" / "sft" / "cli-sft" / "checkpoints" / "000001").is_dir()

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n[1, 2]\n')
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlcoach.cli",
            "sft",
            str(bad),
            "--name",
            "x",
            "--root",
            str(tmp_path / "runs"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2 and "bad.jsonl:2 is not an SFT example" in done.stderr
