"""A hub id as the base model, end to end, with ART's idioms around the loop.

`rlcoach-test/tiny-llama` comes from the hub cache the `hub_cache` fixture lays out on
disk (this machine cannot reach a hub); `HF_HUB_OFFLINE=1` makes `huggingface_hub` read
only that cache. The transformers engine serves it and the trainer trains it: rollouts
as ART writes them (`TrajectoryGroup(coroutines)` inside `gather_trajectory_groups`),
`await model.get_step()`, `model.log(..., split="val")` reaching every sink and the
report, `model.delete_checkpoints()` keeping the latest and the best, and a plain
`with LocalBackend()` closing the engine.
"""

import json
from collections.abc import Mapping, Sequence

from rlcoach import (
    LocalBackend,
    TrainableModel,
    TrajectoryGroup,
    gather_trajectory_groups,
)
from rlcoach.observe.report import write_report
from rlcoach.observe.sinks import RunInfo


class RecordingSink:
    """A user's own sink: keeps what it is given."""

    name = "recording"

    def __init__(self) -> None:
        self.trajectories: list[tuple[int, list[TrajectoryGroup]]] = []
        self.metrics: list[tuple[int, dict]] = []

    def start(self, run: RunInfo) -> None:
        pass

    def log_trajectories(self, step: int, groups: Sequence[TrajectoryGroup]) -> None:
        self.trajectories.append((step, list(groups)))

    def log_metrics(self, step: int, metrics: Mapping) -> None:
        self.metrics.append((step, dict(metrics)))

    def close(self) -> None:
        pass


async def test_a_hub_model_trains_with_art_idioms(hub_cache, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(hub_cache.hf_home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    sink = RecordingSink()
    backend = LocalBackend(
        path=tmp_path, engine={"kind": "transformers", "max_model_len": 512}, sinks=[sink]
    )
    with backend:
        model = TrainableModel(
            name="tiny",
            project="hub",
            base_model=f"{hub_cache.repo_id}@main",
            config={"learning_rate": 5e-3},
        )
        await model.register(backend)
        client = model.openai_client()
        served = [m.id for m in (await client.models.list()).data]
        assert hub_cache.repo_id in served  # the base weights under the hub id

        async def rollout(number: int):
            async with model.rollout(task="greet") as scope:
                scope.metadata["attempt"] = number
                await client.chat.completions.create(
                    model=model.get_inference_name(),
                    messages=[{"role": "user", "content": "Say hi."}],
                    max_tokens=6,
                    temperature=1.0,
                )
                scope.reward = number / 3
            return scope.trajectory

        for _ in range(2):
            groups = await gather_trajectory_groups(
                (TrajectoryGroup(rollout(n) for n in range(4)) for _ in range(1)),
                pbar_desc="gather",
                max_exceptions=0,
            )
            assert groups[0].trajectories[3].metadata == {"task": "greet", "attempt": 3}
            step_before = await model.get_step()
            await model.log(groups, split="val", metrics={"note": 1.0})
            result = await backend.train(model, groups, learning_rate=1e-2)
            assert result.stats.trained and result.step == step_before + 1
            assert result.metrics["loss"] == result.stats.loss
        assert await model.get_step() == 2

        run = tmp_path / "hub" / "tiny"
        records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        evals = [r for r in records if r["event"] == "eval"]
        assert [r["step"] for r in evals] == [0, 1]
        assert evals[0]["val/reward"] == 0.5 and evals[0]["val/rollouts"] == 4
        assert evals[0]["val/note"] == 1.0 and evals[0]["split"] == "val"
        assert (run / "trajectories" / "val" / "000001.jsonl").is_file()
        assert "Evaluations" in write_report(run).read_text()

        # Step 1 evaluated like step 0 (both 0.5): the best is the first, step 1 (step 0
        # is the base model, no checkpoint). Step 2 is the latest. Nothing is left to go.
        assert await model.delete_checkpoints("val/reward") == []
        result = await backend.train(model, groups)
        assert await model.delete_checkpoints("val/reward") == [2]
        kept = sorted(p.name for p in (run / "checkpoints").iterdir())
        assert kept == ["000001", "000003"]
        answer = await client.chat.completions.create(
            model="tiny@1", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert answer.choices[0].message is not None
    assert backend.gateway is None  # the plain `with` closed the engine
    # Plug-in sinks run on threads of their own; closing the backend drained them.
    logged_val = [g for _, gs in sink.trajectories for g in gs if g.metadata.get("split")]
    assert len(logged_val) == 2 and logged_val[0].metadata["split"] == "val"
    events = [m["event"] for _, m in sink.metrics]
    assert events == ["eval", "train", "eval", "train", "train"]
