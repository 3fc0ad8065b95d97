"""The async pipeline (pipeline.py) and the staleness bound (staleness.py) on the CPU.

Everything here is real: the transformers engine behind the real gateway, rollouts
through `model.openai_client()`, the real LoRA trainer, checkpoints and publishing; the
model is a tiny random-weight Llama with the bundled tokenizer (`tiny_chat_model`), so a
step takes well under a second. On a CPU the loop's default is synchronous (generation
and training would share two cores); these tests ask for `overlap=True`, which runs the
code a GPU runs by default, to check its semantics: the bound, the version tags, stale
samples dropped, a step failing while the next batch samples, and resume after a restart.
"""

import json
from typing import Any

import pytest

from rlcoach import (
    ConfigError,
    LocalBackend,
    TrainableModel,
    TrajectoryGroup,
    Validation,
    gather_trajectory_groups,
    load_groups,
    run_pipeline,
)

QUESTIONS = ["Name a colour.", "Name a fruit."]
GROUP = 3
CONFIG = {"learning_rate": 1e-3, "max_staleness": 1}


@pytest.fixture(scope="module")
async def backend(tmp_path_factory):
    backend = LocalBackend(tmp_path_factory.mktemp("runs"), engine={"kind": "transformers"})
    yield backend
    await backend.close()


class Batches:
    """The batch function: GROUP rollouts per question through the policy endpoint,
    rewards 0, 1, 2 within each group (always variance); keeps every batch it made."""

    def __init__(self, model: TrainableModel) -> None:
        self.model = model
        self.client = model.openai_client()
        self.made: dict[int, list[TrajectoryGroup]] = {}

    async def one(self, question: str, reward: int, served: str | None):
        async with self.model.rollout(question=question) as rollout:
            await self.client.chat.completions.create(
                model=served or self.model.name,
                messages=[{"role": "user", "content": question}],
                max_tokens=4,
                temperature=1.0,
            )
            rollout.reward = reward
        return rollout.trajectory

    async def __call__(self, index: int, served: str | None = None) -> list[TrajectoryGroup]:
        groups = await gather_trajectory_groups(
            [[self.one(q, k, served) for k in range(GROUP)] for q in QUESTIONS], progress=False
        )
        self.made[index] = groups
        return groups


def _versions(groups: list[TrajectoryGroup]) -> list[int]:
    return [t.policy_version for g in groups for t in g.trajectories]


async def test_the_cpu_default_is_synchronous(backend, tiny_chat_model):
    model = TrainableModel("sync", "pipeline", base_model=str(tiny_chat_model), config=CONFIG)
    await model.register(backend)
    assert backend.can_overlap is False
    batches = Batches(model)
    steps = await run_pipeline(model, batches, until_step=2)
    assert [(s.sampled_from, s.trained_from) for s in steps] == [(0, 0), (1, 1)]
    assert _versions(batches.made[0]) == [0] * 6 and _versions(batches.made[1]) == [1] * 6
    assert model.step == 2


async def test_overlap_samples_the_next_batch_while_a_step_trains(backend, tiny_chat_model):
    model = TrainableModel("overlap", "pipeline", base_model=str(tiny_chat_model), config=CONFIG)
    await model.register(backend)
    batches = Batches(model)
    steps = await run_pipeline(model, batches, until_step=3, overlap=True)
    assert [s.index for s in steps] == [0, 1, 2] and model.step == 3
    assert all(s.error is None and s.result.stats.trained for s in steps)
    # Batch k+1 began sampling from version k, while step k trained: one version of lag.
    assert [s.lag for s in steps] == [0, 1, 1]
    assert steps[1].rollout_start < steps[0].train_end
    for step in steps:
        for trajectory in (t for g in batches.made[step.index] for t in g.trajectories):
            version = trajectory.policy_version
            assert step.sampled_from <= version <= step.trained_from
            assert {c.policy for c in trajectory.choices} == {f"overlap@{version}"}
        staleness = step.result.staleness
        assert staleness.stale_dropped == 0 and staleness.staleness_max <= 1
        assert staleness.trained_version == step.trained_from
    assert steps[1].result.staleness.staleness_max == 1  # its first calls went to @0
    records = [
        json.loads(line)
        for line in backend.paths(model).metrics.read_text().splitlines()
        if line.strip()
    ]
    assert [r["event"] for r in records] == ["train"] * 3
    assert all("stale_dropped" in r and "staleness_max" in r for r in records)


async def test_samples_older_than_the_bound_are_not_trained(backend, tiny_chat_model):
    config = {**CONFIG, "max_staleness": 0}
    model = TrainableModel("strict", "pipeline", base_model=str(tiny_chat_model), config=config)
    await model.register(backend)
    batches = Batches(model)
    old, fresh = await batches(0), await batches(1)
    assert (await model.train(fresh)).step == 1
    result = await model.train(old)  # sampled by version 0, one version behind the bound
    assert result.staleness.stale_dropped == 6 and not result.stats.trained
    assert model.step == 1
    # Samples of the base model's own name carry no version of this model: kept.
    base = await batches(2, served=backend.engine.base_name)
    assert _versions(base) == [None] * 6
    result = await model.train(base)
    assert result.stats.trained and result.staleness.unversioned == 6
    assert result.staleness.stale_dropped == 0 and model.step == 2


async def test_a_step_failing_mid_overlap_loses_nothing(backend, tiny_chat_model, monkeypatch):
    """The failure is injected at one seam: `LoraTrainer.step` raises on batch 1, standing
    in for a step that breaks half-way through an update (out of GPU memory, say), which a
    CPU cannot produce on purpose; bad input is refused before any step starts."""
    from rlcoach.trainer.lora import LoraTrainer

    model = TrainableModel("faulty", "pipeline", base_model=str(tiny_chat_model), config=CONFIG)
    await model.register(backend)
    batches = Batches(model)
    real_step = LoraTrainer.step

    def step(self, groups, config):
        poisoned = {t.id for g in batches.made.get(1, []) for t in g.trajectories}
        if poisoned & {t.id for g in groups for t in g.trajectories}:
            raise RuntimeError("the step broke half-way")
        return real_step(self, groups, config)

    monkeypatch.setattr(LoraTrainer, "step", step)
    steps = await run_pipeline(model, batches, until_step=3, overlap=True)
    assert [s.index for s in steps] == [0, 1, 2]
    failed = steps[1]
    assert failed.result is None and "the step broke half-way" in failed.error
    # The batch sampled while the failing step ran is trained next, from checkpoint 1.
    assert steps[2].rollout_start < failed.train_end
    assert steps[2].trained_from == 1 and steps[2].result.stats.trajectories == 6
    assert steps[2].result.step == 2 and model.step == 2
    paths = backend.paths(model)
    kept = list(paths.trajectories.glob("000002-failed*.jsonl"))
    assert len(kept) == 1 and load_groups(kept[0]) == batches.made[1]
    assert load_groups(paths.trajectory_file(2)) == batches.made[2]
    records = [json.loads(x) for x in paths.metrics.read_text().splitlines() if x.strip()]
    assert [r["event"] for r in records] == ["train", "failed", "train"]
    assert records[1]["batch_file"] == str(kept[0]) and records[1]["error"] == failed.error


async def test_resume_after_a_restart_continues_the_versions(tmp_path, tiny_chat_model):
    def make_model():
        return TrainableModel("resumed", "pipeline", base_model=str(tiny_chat_model), config=CONFIG)

    async with LocalBackend(tmp_path, engine={"kind": "transformers"}) as first:
        model = make_model()
        await model.register(first)
        before = Batches(model)
        await run_pipeline(model, before, until_step=2, overlap=True)
        assert model.step == 2
    async with LocalBackend(tmp_path, engine={"kind": "transformers"}) as second:
        model = make_model()
        await model.register(second)
        assert model.step == 2 and model.served_name == "resumed@2"
        after = Batches(model)
        steps = await run_pipeline(model, after, until_step=4, overlap=True)
        assert [s.index for s in steps] == [2, 3] and model.step == 4
        assert steps[0].sampled_from == 2 and _versions(after.made[2]) == [2] * 6
        # A batch sampled before the restart (version 0) is three versions stale now.
        result = await model.train(before.made[0])
        assert result.staleness.stale_dropped == 6 and model.step == 4


async def test_validation_keeps_the_best_checkpoint_and_stops_when_it_falls(
    backend, tiny_chat_model
):
    """The held-out scores are scripted by step (the scorer is the user's function); the
    checkpoints, the early stop and the restore are real."""
    model = TrainableModel("keepbest", "pipeline", base_model=str(tiny_chat_model), config=CONFIG)
    await model.register(backend)
    scores = {0: 0.2, 1: 0.6, 2: 0.9, 3: 0.4, 4: 0.3, 5: 0.1}
    validation = Validation(lambda: _score(scores, model), patience=2)
    run = await run_pipeline(model, Batches(model), until_step=6, validation=validation)
    assert [s.validation for s in run] == [0.6, 0.9, 0.4, 0.3]  # stopped after two falls
    assert (run.baseline, run.best_step, run.best_score) == (0.2, 2, 0.9)
    assert run.restored_from == 2 and model.step == 5  # checkpoint 2 served again, as step 5
    checkpoints = backend.paths(model).checkpoints
    adapter = "adapter_model.safetensors"
    assert (checkpoints / "000005" / adapter).read_bytes() == (
        checkpoints / "000002" / adapter
    ).read_bytes()
    records = [json.loads(line) for line in backend.paths(model).metrics.read_text().splitlines()]
    restores = [r for r in records if r.get("event") == "restore"]
    assert [(r["step"], r["restored_from"]) for r in restores] == [(5, 2)]
    reply = await model.openai_client().chat.completions.create(
        model=model.name, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    assert reply.model == "keepbest@5"
    result = await model.train(await Batches(model)(5))  # training goes on from the restore
    assert result.step == 6 and result.stats.trained
    with pytest.raises(ConfigError, match="no committed checkpoint 9"):
        await model.restore(9)


async def test_validation_compares_tuples_and_lets_a_plateau_run_on(backend, tiny_chat_model):
    """(success, reward) scores: the first number decides, the second breaks its ties;
    with `plateau_stops=False` a tie neither counts toward `patience` nor resets it
    (scripted scores by step; the steps, the stop and the restore are real)."""
    model = TrainableModel("plateau", "pipeline", base_model=str(tiny_chat_model), config=CONFIG)
    await model.register(backend)
    scores = {
        0: (0.0, 0.1),
        1: (0.5, 0.6),
        2: (0.5, 0.6),  # a tie: the earlier step stays best, and no fall is counted
        3: (0.5, 0.7),  # the same success with more reward: a new best
        4: (0.25, 0.7),  # a fall (1)
        5: (0.5, 0.7),  # a tie again: still one fall
        6: (0.375, 0.9),  # a fall (2): stop
        7: (1.0, 1.0),
    }
    validation = Validation(lambda: _score(scores, model), patience=2, plateau_stops=False)
    run = await run_pipeline(model, Batches(model), until_step=8, validation=validation)
    assert [s.validation for s in run] == [scores[step] for step in range(1, 7)]
    assert (run.baseline, run.best_step, run.best_score) == ((0.0, 0.1), 3, (0.5, 0.7))
    assert run.restored_from == 3 and model.step == 7
    with pytest.raises(ConfigError, match="empty tuple"):
        await run_pipeline(model, Batches(model), 8, validation=Validation(_empty))


async def _empty() -> tuple[float, ...]:
    return ()


async def _score(scores: dict[int, Any], model: TrainableModel) -> Any:
    return scores[model.step]
