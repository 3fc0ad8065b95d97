"""One commit point per step, in process: `LocalBackend` with the transformers engine on
the tiny random-weight model (tests/conftest.py), the real trainer, checkpoints, router
and publish. Faults are real: a file-size limit (RLIMIT_FSIZE, the kernel refusing the
write like a full disk would) on the optimizer state, a batch whose loss overflows, and
failpoints (core/runtime/failpoints.py) raising at a point of the step or making the loss of
one optimizer update NaN. The same commit point under kill -9 of `rlcoach serve` is in
test_serve_faults.py.
"""

import asyncio
import json
import resource
import signal

import pytest
import torch
from peft import get_peft_model_state_dict
from safetensors.torch import load_file

from rlcoach import (
    ChatRecord,
    LocalBackend,
    SampledChoice,
    TrainableModel,
    Trajectory,
    TrajectoryGroup,
)
from rlcoach.backend.step_commit import METRICS_RECORD
from rlcoach.errors import CheckpointError
from rlcoach.paths import UNCOMMITTED
from rlcoach.runtime.failpoints import FOLDER_VARIABLE, arm
from rlcoach.trainer.checkpoint import OPTIMIZER_FILE


def _trajectory(policy: str, reward: float, logprob: float = -1.0) -> Trajectory:
    return Trajectory(
        choices=[
            SampledChoice(
                message={"role": "assistant", "content": "x"},
                prompt_token_ids=[1, 2, 3],
                token_ids=[4, 5],
                logprobs=[logprob, logprob],
                policy=policy,
            )
        ],
        reward=reward,
    )


def _batch(model: TrainableModel, low_logprob: float = -1.0) -> list[TrajectoryGroup]:
    """One group sampled from the model's latest step (rewards 1 and 0)."""
    policy = f"{model.name}@{model.step}"
    return [TrajectoryGroup([_trajectory(policy, 1.0), _trajectory(policy, 0.0, low_logprob)])]


def _records(backend: LocalBackend, model: TrainableModel) -> list[dict]:
    lines = backend.paths(model).metrics.read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


@pytest.fixture
async def trained(tmp_path, tiny_model_path):
    """A model at step 1 on a fresh backend."""
    backend = LocalBackend(tmp_path, engine={"kind": "transformers"})
    model = TrainableModel("commit", "p", base_model=str(tiny_model_path))
    await model.register(backend)
    assert (await model.train(_batch(model))).step == 1
    yield backend, model
    await backend.close()


def _state(backend: LocalBackend, model: TrainableModel) -> tuple:
    """What says which step a model is at: its step, the router's latest, the folders."""
    folders = sorted(p.name for p in backend.paths(model).checkpoints.iterdir())
    return model.step, backend.gateway.router.latest[model.name], folders


async def test_a_failed_optimizer_state_write_rolls_the_whole_step_back(trained):
    backend, model = trained
    paths = backend.paths(model)
    first = paths.checkpoint(1)
    adapter = (first / "adapter_model.safetensors").stat().st_size
    optimizer = (first / OPTIMIZER_FILE).stat().st_size
    assert adapter < optimizer  # AdamW's two moments per weight
    before = _state(backend, model)
    trainer = backend._trainers[model.name]
    # Any file written past the limit fails with EFBIG, as on a full disk: the adapter
    # and the small files fit, the optimizer state does not.
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, ((adapter + optimizer) // 2, hard))
    try:
        with pytest.raises(CheckpointError, match="optimizer state of step 2") as failed:
            await model.train(_batch(model))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
    # Wholly rolled back: the router serves step 1, no folder of step 2 (not even an
    # uncommitted one), the trainer that took the optimizer step is gone.
    assert "nothing of the step was kept" in str(failed.value) and not failed.value.retryable
    assert _state(backend, model) == before == (1, 1, ["000001"])
    assert model.name not in backend._trainers and trainer is not None
    assert list(paths.trajectories.glob("000002-failed1.jsonl"))
    assert _records(backend, model)[-1]["event"] == "failed"
    # The retry is step 2 again, from a trainer made from checkpoint 1.
    result = await model.train(_batch(model))
    assert result.step == 2 and backend._trainers[model.name] is not trainer
    assert _state(backend, model) == (2, 2, ["000001", "000002"])
    assert not (paths.checkpoint(2) / UNCOMMITTED).exists()
    assert (paths.checkpoint(2) / OPTIMIZER_FILE).is_file()


async def test_a_failure_after_the_publish_withdraws_the_served_step(
    trained, tmp_path, monkeypatch
):
    backend, model = trained
    monkeypatch.setenv("RLCOACH_FAILPOINT_DIR", str(tmp_path / "failpoints"))
    arm(tmp_path / "failpoints", "step.published", "raise")
    client = model.openai_client()
    with pytest.raises(OSError, match=r"failpoint step\.published"):
        await model.train(_batch(model))
    assert _state(backend, model) == (1, 1, ["000001"])
    reply = await client.chat.completions.create(
        model=model.name, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert reply.model == "commit@1"  # the published step 2 was withdrawn
    assert (await model.train(_batch(model))).step == 2
    reply = await client.chat.completions.create(
        model=model.name, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert reply.model == "commit@2"


async def test_a_batch_whose_loss_is_not_finite_is_skipped_and_reported(trained):
    backend, model = trained
    trainer = backend._trainers[model.name]
    # Finite numbers, so they pass the input checks; but exp(new - old) overflows for
    # the trajectory with a negative advantage, and its loss is infinite.
    result = await model.train(_batch(model, low_logprob=-1000.0))
    assert not result.stats.trained and result.stats.non_finite == 1
    assert result.step == 1 and result.checkpoint is None
    assert _state(backend, model) == (1, 1, ["000001"])
    record = _records(backend, model)[-1]
    assert record["event"] == "skipped" and record["non_finite"] == 1 and record["skip"] == 1
    assert backend.paths(model).trajectory_file(2, skip=1).is_file()
    # Stopped before its update: the trainer still matches checkpoint 1 and is kept.
    assert backend._trainers[model.name] is trainer
    assert (await model.train(_batch(model))).step == 2


async def test_steps_of_one_model_run_one_at_a_time(trained):
    backend, model = trained
    batches = [_batch(model) for _ in range(3)]  # all sampled from step 1
    config = {"max_staleness": 4}
    results = await asyncio.gather(*(model.backend.train(model, b, config) for b in batches))
    assert sorted(r.step for r in results) == [2, 3, 4] and model.step == 4
    assert [r["step"] for r in _records(backend, model)] == [1, 2, 3, 4]


def _at_checkpoint(backend: LocalBackend, model: TrainableModel, step: int | None = None) -> bool:
    """Whether the model's trainer (as the next step gets it) holds exactly the adapter of
    checkpoint `step` (the latest by default)."""
    folder = backend.paths(model).checkpoint(model.step if step is None else step)
    saved = load_file(str(folder / "adapter_model.safetensors"))
    weights = get_peft_model_state_dict(backend._trainer(model).model)
    assert weights.keys() == saved.keys()
    return all(torch.equal(weights[k].cpu(), saved[k]) for k in saved)


async def test_a_later_mini_batch_that_is_not_finite_leaves_no_update_in_memory(trained):
    backend, model = trained
    trainer = backend._trainers[model.name]
    assert _at_checkpoint(backend, model)
    # Two mini-batches: the first (reward 1) is finite and updates the adapter; the
    # second's loss overflows (as in the test above), so the step is skipped.
    result = await model.train(_batch(model, low_logprob=-1000.0), {"mini_batches": 2})
    stats = result.stats
    assert not stats.trained and stats.non_finite == 2 and stats.optimizer_steps == 1
    assert _state(backend, model) == (1, 1, ["000001"])
    # The update of mini-batch 1 is gone: the trainer was dropped, and the one the next
    # step gets is the checkpoint's.
    assert model.name not in backend._trainers and trainer is not None
    assert _at_checkpoint(backend, model)
    assert (await model.train(_batch(model), {"mini_batches": 2})).step == 2
    assert _at_checkpoint(backend, model) and not _at_checkpoint(backend, model, 1)


async def test_sft_whose_loss_is_not_finite_is_skipped_and_rolled_back(
    trained, tmp_path, monkeypatch
):
    backend, model = trained
    monkeypatch.setenv(FOLDER_VARIABLE, str(tmp_path / "failpoints"))
    examples = [
        ChatRecord(
            messages=[{"role": "user", "content": f"Say {w}."}, {"role": "assistant", "content": w}]
        )
        for w in ("yes", "no")
    ]
    # Two optimizer updates (one example each); the second one's loss is made NaN.
    arm(tmp_path / "failpoints", "update.loss", "nan", at=2)
    result = await model.train_sft(examples, {"batch_size": 1})
    stats = result.stats
    assert not stats.trained and stats.non_finite == 2 and stats.optimizer_steps == 1
    assert result.step == 1 and result.checkpoint is None
    assert _state(backend, model) == (1, 1, ["000001"])
    record = _records(backend, model)[-1]
    assert record["event"] == "skipped" and record["non_finite"] == 2 and record["skip"] == 1
    assert (backend.paths(model).dir / "sft" / "000002-skip1.jsonl").is_file()
    assert _at_checkpoint(backend, model)  # the first update was rolled back
    assert (await model.train_sft(examples, {"batch_size": 1})).step == 2


async def test_a_committed_steps_metrics_line_is_written_once_whatever_fails(
    trained, tmp_path, monkeypatch
):
    """The failpoint raises between the commit and the metrics line (as a full disk
    would): the step stands, and its line is written by the next commit; a second
    registration (as after a kill -9 there, test_serve_faults.py) adds nothing twice."""
    backend, model = trained
    paths = backend.paths(model)
    monkeypatch.setenv(FOLDER_VARIABLE, str(tmp_path / "failpoints"))
    arm(tmp_path / "failpoints", "step.committed", "raise")
    result = await model.train(_batch(model))
    assert result.step == 2 and _state(backend, model) == (2, 2, ["000001", "000002"])
    assert [r["step"] for r in _records(backend, model)] == [1]
    line = json.loads((paths.checkpoint(2) / METRICS_RECORD).read_text())
    assert await model.train(_batch(model)) and model.step == 3
    records = _records(backend, model)
    assert [(r["step"], r["event"]) for r in records] == [(1, "train"), (2, "train"), (3, "train")]
    assert records[1] == line
    # A torn last line (a crash mid-append) neither hides nor swallows a line; another
    # backend registering the model (a restart) writes nothing twice.
    with paths.metrics.open("a") as handle:
        handle.write('{"step": 3, "ev')
    again = LocalBackend(backend.root, engine={"kind": "transformers"})
    other = TrainableModel("commit", "p", base_model=model.base_model)
    await other.register(again)
    assert (await other.train(_batch(other))).step == 4
    await again.close()
    lines = paths.metrics.read_text().splitlines()
    assert lines[3] == '{"step": 3, "ev' and len(lines) == 5
    assert [json.loads(lines[i])["step"] for i in (0, 1, 2, 4)] == [1, 2, 3, 4]


async def test_a_step_is_served_from_a_serving_copy_then_from_its_checkpoint(trained):
    """The engine loads each step from a serving copy (RAM-backed where /dev/shm has room,
    else beside the run), written before the checkpoint is synced: the same weights in
    the base weights' dtype. Once committed, the router loads the step from its
    checkpoint; a copy is deleted when the engine unloads it, the rest at close."""
    backend, model = trained
    router, copies = backend.gateway.router, backend.host.serving_copies
    paths = backend.paths(model)
    loaded = dict(router._loaded)
    staged = loaded["commit@1"]
    assert staged != paths.checkpoint(1) and staged in copies._copies
    assert router.checkpoints["commit@1"] == paths.checkpoint(1)  # relocated
    durable = load_file(paths.checkpoint(1) / "adapter_model.safetensors")
    served = load_file(staged / "adapter_model.safetensors")
    assert durable.keys() == served.keys()
    trainer = backend._trainers[model.name]
    base_dtype = next(p.dtype for p in trainer.model.parameters() if not p.requires_grad)
    for key, tensor in durable.items():
        assert served[key].dtype == base_dtype
        assert torch.equal(served[key], tensor.to(base_dtype))
    # Steps beyond the engine's adapter slots evict step 1: its copy goes with it.
    for _ in range(router.max_loras):
        await model.train(_batch(model))
    assert "commit@1" not in router._loaded and not staged.exists()
    live = [path for name, path in router._loaded.items()]
    assert all(path.exists() for path in live) and len(copies._copies) <= router.max_loras
    await backend.close()
    assert not any(path.exists() for path in live)
