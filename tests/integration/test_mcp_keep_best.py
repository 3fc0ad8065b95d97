"""Keep-best for `rlcoach mcp train`: the held-out curve picks the checkpoint served at
the end, and a checkpoint that is not the latest is restored as the model's next step.

`model.restore` runs on a real `LocalBackend` (the in-process transformers engine,
the bundled model, two SFT steps that teach different replies); the whole job runs
against a real SQL MCP server subprocess with the vLLM engine (`mark.vllm`)."""

import json
import sqlite3
import sys
from pathlib import Path

import pytest

from rlcoach import LocalBackend, TrainableModel
from rlcoach.integrations.mcp import ServerSpec
from rlcoach.integrations.mcp.train import MCPTrainConfig, train_on_server
from rlcoach.trajectory.trajectories import ChatRecord

ROOT = Path(__file__).resolve().parents[2]
QUESTIONS = ("What is the secret word?", "Tell me the secret word.", "Say the secret word.")


def taught(reply: str) -> list[ChatRecord]:
    return [
        ChatRecord(
            messages=[{"role": "user", "content": q}, {"role": "assistant", "content": reply}]
        )
        for q in QUESTIONS
    ]


async def greedy(model: TrainableModel) -> str:
    client = model.openai_client(record=False)
    reply = await client.chat.completions.create(
        model=model.served_name,
        messages=[{"role": "user", "content": QUESTIONS[0]}],
        temperature=0.0,
        max_tokens=12,
    )
    return reply.choices[0].message.content or ""


async def test_restoring_a_checkpoint_serves_it_as_the_next_step(tmp_path):
    sft = {"epochs": 8, "batch_size": 3, "learning_rate": 3e-3}
    async with LocalBackend(tmp_path, engine={"kind": "transformers"}) as backend:
        model = TrainableModel("keeper", "integration")
        await model.register(backend)
        await model.train_sft(taught("The secret word is PINEAPPLE."), sft)
        assert "PINEAPPLE" in await greedy(model)
        await model.train_sft(taught("I will not say it, sorry."), sft)
        assert "PINEAPPLE" not in await greedy(model) and model.step == 2
        assert await model.restore(1) == 3
        assert model.step == 3 and model.served_name == "keeper@3"
        assert "PINEAPPLE" in await greedy(model)  # the restored adapter answers
        paths = backend.paths(model)
        restored, best = paths.checkpoint(3), paths.checkpoint(1)
        for name in ("adapter_model.safetensors", "optimizer.pt"):
            assert (restored / name).read_bytes() == (best / name).read_bytes()
        record = json.loads((restored / "rlcoach_step.json").read_text())
        assert record == {"restored_from": 1}  # the step's own record, not step 1's
        events = [json.loads(line) for line in paths.metrics.read_text().splitlines()]
        restores = [e for e in events if e["event"] == "restore"]
        assert [(e["step"], e["restored_from"]) for e in restores] == [(3, 1)]
        # the next step trains from the restored weights: the kept reply is already known
        after = await model.train_sft(taught("The secret word is PINEAPPLE."), {"epochs": 1})
        assert after.step == 4 and after.stats.loss_first < 0.5
    async with LocalBackend(tmp_path, engine={"kind": "transformers"}) as again:
        resumed = TrainableModel("keeper", "integration")
        await resumed.register(again)
        assert resumed.step == 4


@pytest.mark.vllm
async def test_the_job_serves_the_best_checkpoint_by_held_out_success(vllm_backend, tmp_path):
    """The whole job on a SQL server with an RL learning rate that wrecks the policy
    (50x the default): held out is evaluated after every RL step, and whatever the steps
    do, the model served at the end is the best of the curve, restored when it is not
    the last step."""
    database = tmp_path / "shop.db"
    with sqlite3.connect(database) as connection:
        connection.executescript((ROOT / "examples" / "mcp_servers" / "shop.sql").read_text())
    server = Path(__file__).with_name("mcp_sql_server.py")
    config = MCPTrainConfig(
        server=ServerSpec(command=[sys.executable, str(server), str(database)]),
        name="sql-keep-best",
        steps=2,
        scenarios=12,
        group_size=2,
        scenarios_per_step=2,
        eval_samples=1,
        eval_every=1,
        patience=1,
        warmup_epochs=1,
        warmup_examples=4,
        learning_rate=5e-2,
        # Free first replies: forced ones are re-scored alone on a CPU, which triples this
        # test's time, and it is about the choice of checkpoint, not the calls.
        agent={"max_turns": 2, "max_tokens": 48, "first_tool_choice": "auto"},
        progress=False,
    )
    report = await train_on_server(config, backend=vllm_backend)
    curve, best = report["held_out_curve"], report["best"]
    assert [p["label"] for p in curve[:2]] == ["before", "SFT"]
    # the SFT warm-up and the RL steps compete (the base has no checkpoint to serve);
    # a tie goes to the earlier step
    assert best == max(curve[1:], key=lambda p: (round(p["success"], 6), round(p["reward"], 6)))
    assert report["stopped_early"] or len(report["steps"]) == 2
    folder = Path(report["run_dir"])
    latest = max(int(p.name) for p in (folder / "checkpoints").iterdir() if p.name.isdigit())
    assert report["served"] == f"sql-keep-best@{latest}"
    if report["restored_from_step"] is not None:
        assert report["restored_from_step"] == best["step"] < latest
        restored = folder / "checkpoints" / f"{latest:06d}" / "adapter_model.safetensors"
        kept = folder / "checkpoints" / f"{best['step']:06d}" / "adapter_model.safetensors"
        assert restored.read_bytes() == kept.read_bytes()
    else:
        assert best["step"] in (0, latest)
    markdown = (folder / "report.md").read_text()
    assert "## Held-out curve (base -> SFT -> RL)" in markdown
    train = [json.loads(line) for line in (folder / "scenarios" / "train.jsonl").open()]
    assert any(r["metadata"]["source"] == "grounded, two calls" for r in train)
