"""The LoRA trainer over two gloo CPU ranks (torchrun, FSDP2) against the single process.

A tiny random-weight Llama (tests/tiny_llama.py: hidden 64, two layers, tied embeddings)
built from its config; trajectories carry random token ids with rewards that vary within
groups, one group without variance (skipped). Nothing is faked: the ranks are real
torchrun processes, and the single-process `LoraTrainer` is the reference. The exact
comparisons pin fp32 with RLCOACH_CPU_BF16=0 (see `ranks`); the killed-rank test takes
the dtype `rlcoach.runtime.hardware` decides, with that dtype's tolerance (`_assert_stats_agree`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from tiny_llama import tiny_groups

from rlcoach import LocalBackend, TrainableModel
from rlcoach.config import LoraConfig, TrainConfig
from rlcoach.errors import CheckpointError, TrainerError
from rlcoach.runtime.hardware import CPU_BF16_ENV, fast_bf16
from rlcoach.trainer import distributed
from rlcoach.trainer import ranks as ranks_module
from rlcoach.trainer.base import StepStats, Trainer
from rlcoach.trainer.checkpoint import OPTIMIZER_FILE
from rlcoach.trainer.distributed import RANK_MODULE, DistributedTrainer
from rlcoach.trainer.lora import LoraTrainer
from rlcoach.trainer.ranks import split_by_tokens
from rlcoach.trainer.sequences import TrainSequence

# Two mini-batches: two optimizer steps, the second with gradients on lora_A too (its
# gradient is zero while lora_B is still at its zero init). 64-token rows: several rows
# per rank, unevenly many.
CONFIG = TrainConfig(
    learning_rate=1e-3, mini_batches=2, micro_batch_tokens=64, kl_coef=0.05, seed=3
)


def _assert_stats_agree(got: StepStats, expected: StepStats) -> None:
    """The ranks' stats against the single process's, within what the dtype in use allows.

    fp32 (`fast_bf16` off: an AVX2-only CPU, or RLCOACH_CPU_BF16=0): the same sums in
    another order, so float32 rounding only (rel 1e-5). bf16 autocast (a CPU with bf16
    instructions, or RLCOACH_CPU_BF16=1): each rank packs other rows than the single
    process, so its matmuls have other shapes and round differently, and a bf16 result
    keeps 8 significant bits (relative error up to 2**-9): the means must agree to one
    bf16 ulp (2**-8, measured here: 2e-4 at most); the KL, a difference of two nearly
    equal log-probs, to 1e-6 absolute (measured: 7e-8); and the clipped share to one
    token, whose ratio may round across a clip bound."""
    for name in (
        "trained",
        "groups",
        "groups_skipped_no_variance",
        "trajectories",
        "sequences",
        "sampled_tokens",
        "total_tokens",
    ):
        assert getattr(got, name) == getattr(expected, name), name
    bf16 = fast_bf16("cpu")
    rel, kl_abs = (2**-8, 1e-6) if bf16 else (1e-5, 1e-7)
    for name in ("loss", "grad_norm", "mean_ratio"):
        assert getattr(got, name) == pytest.approx(getattr(expected, name), rel=rel, abs=1e-7)
    assert got.kl == pytest.approx(expected.kl, rel=rel, abs=kl_abs)
    one_token = 1 / expected.sampled_tokens if bf16 else 1e-7
    assert abs(got.clip_fraction - expected.clip_fraction) <= one_token


def _adapter(trainer: LoraTrainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


@pytest.fixture(scope="module")
def ranks(tiny_model):
    """Two ranks in fp32 whatever the CPU: the tests that take them prove the ranks'
    step is the single process's, which holds to float32 rounding only (a bf16 step
    differs from another packing of its rows by bf16 rounding: an element whose gradient
    is near zero can even take AdamW's step the other way, 2 x lr off, as measured here).
    The machine's own dtype is compared, with its tolerance, in the killed-rank test."""
    trainer = DistributedTrainer(
        tiny_model,
        CONFIG,
        ranks=2,
        env={CPU_BF16_ENV: "0"},
        start_timeout_s=300,
        call_timeout_s=120,
    )
    yield trainer
    trainer.close()


@pytest.fixture
def fp32(monkeypatch):
    """The single-process reference in fp32, as the ranks (see `ranks`)."""
    monkeypatch.setenv(CPU_BF16_ENV, "0")


def test_sequences_are_dealt_to_ranks_by_token_count():
    sequences = [TrainSequence([1] * n, [1] * n, [0.0] * n, 1.0, str(n)) for n in (9, 7, 5, 3, 1)]
    shares = split_by_tokens(sequences, 2)
    assert [[len(s.token_ids) for s in share] for share in shares] == [[9, 3, 1], [7, 5]]
    assert split_by_tokens(sequences[:1], 3)[1:] == [[], []]  # ranks without rows


def test_two_ranks_match_the_single_process_step(tiny_model, ranks, fp32, tmp_path):
    groups = tiny_groups(0)
    single = LoraTrainer(tiny_model, CONFIG, device="cpu")
    before = _adapter(single)
    expected = single.step(groups)
    got = ranks.step(groups)

    assert expected.groups_skipped_no_variance == 1 and expected.trained
    _assert_stats_agree(got, expected)

    ranks.save_adapter(tmp_path)
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "adapter_model.safetensors"))
    after = {k.replace(".default", ""): v for k, v in _adapter(single).items()}
    assert set(saved) == set(after)
    for key, value in after.items():
        moved = not torch.equal(value, before[key.replace(".weight", ".default.weight")])
        assert moved, f"{key} did not change in the single-process step"
        torch.testing.assert_close(saved[key], value, rtol=1e-5, atol=1e-7, msg=key)


def test_checkpoint_is_written_once_and_resumes(tiny_model, ranks, fp32, tmp_path):
    groups = tiny_groups(1)
    reference = LoraTrainer(tiny_model, CONFIG, device="cpu")
    reference.step(groups)
    reference.save(tmp_path / "single")

    ranks.save(tmp_path / "ranks")
    names = sorted(p.name for p in (tmp_path / "ranks").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "single").iterdir())
    assert names == [
        "README.md",
        "adapter_config.json",
        "adapter_model.safetensors",
        OPTIMIZER_FILE,
    ]
    config = json.loads((tmp_path / "ranks" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(tiny_model)
    state = torch.load(tmp_path / "ranks" / OPTIMIZER_FILE)
    single_state = torch.load(tmp_path / "single" / OPTIMIZER_FILE)
    assert set(state["state"]) == set(single_state["state"])
    assert state["state"][0]["exp_avg"].shape == single_state["state"][0]["exp_avg"].shape

    # One loader: the ranks refuse what the single process refuses, with the same error.
    other = LoraTrainer(tiny_model, CONFIG.model_copy(update={"lora": LoraConfig(rank=4)}), "cpu")
    other.save(tmp_path / "rank-4")
    for folder, match in [
        (tmp_path / "nowhere", "has no adapter_model.safetensors; fix:"),
        (tmp_path / "rank-4", r"has shape \(4, 64\) in the checkpoint and \(8, 64\).*fix:"),
    ]:
        with pytest.raises(CheckpointError, match=match) as single_error:
            LoraTrainer(tiny_model, CONFIG, device="cpu").load(folder)
        with pytest.raises(CheckpointError) as ranks_error:
            ranks.load(folder)
        assert str(ranks_error.value) == str(single_error.value)

    # The single process's checkpoint loaded into the ranks; both take the same next step.
    ranks.load(tmp_path / "single")
    next_groups = tiny_groups(2)
    expected = reference.step(next_groups)
    got = ranks.step(next_groups)
    _assert_stats_agree(got, expected)
    ranks.save_adapter(tmp_path / "after")
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "after" / "adapter_model.safetensors"))
    for name, value in _adapter(reference).items():
        torch.testing.assert_close(saved[name.replace(".default", "")], value, rtol=1e-5, atol=1e-7)

    # And peft loads the ranks' adapter onto the base model.
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), tmp_path / "after")


async def test_a_killed_rank_fails_the_next_step_clearly_and_is_replaced(tiny_model, tmp_path):
    """Through LocalBackend's trainer cache (the seam of test_trainer_cache: a model path
    set by hand, so no engine is started): `cpu_train_ranks=2` makes the ranks, in the
    dtype `rlcoach.runtime.hardware` decides here; their first step matches the single process's
    within that dtype's tolerance, then a rank is killed."""
    backend = LocalBackend(
        tmp_path, engine={"kind": "transformers", "placement": {"cpu_train_ranks": 2}}
    )
    backend._model_path = tiny_model
    model = TrainableModel("tiny", "distributed", config=CONFIG)
    try:
        trainer = backend._trainer(model)
        assert isinstance(trainer, DistributedTrainer) and isinstance(trainer, Trainer)
        assert trainer.log_file.parent == tmp_path / "logs"
        expected = LoraTrainer(tiny_model, CONFIG, device="cpu").step(tiny_groups(3))
        _assert_stats_agree(trainer.step(tiny_groups(3)), expected)
        os.kill(trainer.worker_pids[1], signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(TrainerError, match="training ranks failed during step") as error:
            trainer.step(tiny_groups(0))
        assert time.monotonic() - started < 30
        assert str(trainer.log_file) in str(error.value) and "fix:" in str(error.value)
        with pytest.raises(TrainerError, match="stopped"):
            trainer.save_adapter(tmp_path)
        replacement = backend._trainer(model)  # the next step gets new ranks
        assert replacement is not trainer and not replacement.closed
    finally:
        await backend.close()
    assert replacement.closed


IGNORE_SIGTERM = """
import os, signal
if "RANK" in os.environ:  # torchrun's workers, not torchrun itself
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
"""


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not: it only waits to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_hung_rank_that_ignores_sigterm_is_killed(tiny_model, tmp_path, monkeypatch):
    """Rank 0 ignores SIGTERM, through the one seam here: a `sitecustomize` on the ranks'
    PYTHONPATH (torchrun's workers only); rank 1 hangs (SIGSTOP), so the step runs past
    its timeout. The driver then stops torchrun, which cannot stop the ranks, kills it
    after its grace (shortened to 1 s), and kills each rank still running, recognised by
    the module torchrun launched in its command line."""
    (tmp_path / "sitecustomize.py").write_text(IGNORE_SIGTERM)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    monkeypatch.setattr(distributed, "_STOP_GRACE_S", 1.0)
    trainer = DistributedTrainer(
        tiny_model, CONFIG, ranks=2, env={"PYTHONPATH": path}, call_timeout_s=1
    )
    pids = trainer.worker_pids
    try:
        assert ranks_module.__name__ == RANK_MODULE
        assert all(RANK_MODULE.encode() in Path(f"/proc/{p}/cmdline").read_bytes() for p in pids)
        os.kill(pids[0], signal.SIGTERM)
        time.sleep(0.5)
        assert _alive(pids[0]), "the seam did not make rank 0 ignore SIGTERM"
        os.kill(pids[1], signal.SIGSTOP)
        with pytest.raises(TrainerError, match="during step: it ran past its timeout"):
            trainer.step(tiny_groups(0))
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in pids), "a rank outlived its trainer"
    finally:
        trainer.close()
        for pid in pids:  # a failed run leaves nothing behind either
            with contextlib.suppress(OSError):
                if RANK_MODULE.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)
