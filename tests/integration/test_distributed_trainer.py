"""The LoRA trainer over two gloo CPU ranks (torchrun, FSDP2) against the single process.

A tiny random-weight Llama (hidden 64, two layers, tied embeddings) is built from its
config; trajectories carry random token ids with rewards that vary within groups, one
group without variance (skipped). Nothing is faked: the ranks are real torchrun
processes, and the single-process `LoraTrainer` is the reference.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time

import pytest
import torch

from rlcoach import LocalBackend, SampledChoice, TrainableModel, Trajectory, TrajectoryGroup
from rlcoach.config import TrainConfig
from rlcoach.errors import TrainerError
from rlcoach.trainer.distributed import DistributedTrainer
from rlcoach.trainer.lora import OPTIMIZER_FILE, LoraTrainer
from rlcoach.trainer.ranks import split_by_tokens
from rlcoach.trainer.sequences import TrainSequence

VOCAB = 256
# Two mini-batches: two optimizer steps, the second with gradients on lora_A too (its
# gradient is zero while lora_B is still at its zero init). 64-token rows: several rows
# per rank, unevenly many.
CONFIG = TrainConfig(
    learning_rate=1e-3, mini_batches=2, micro_batch_tokens=64, kl_coef=0.05, seed=3
)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-llama")
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def _groups(seed: int) -> list[TrajectoryGroup]:
    rng = random.Random(seed)

    def trajectory(reward: float) -> Trajectory:
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(4, 30))]
        sampled = [rng.randrange(VOCAB) for _ in range(rng.randint(2, 25))]
        choice = SampledChoice(
            message={"role": "assistant", "content": "x"},
            prompt_token_ids=prompt,
            token_ids=sampled,
            logprobs=[-rng.uniform(3.0, 8.0) for _ in sampled],
            policy="tiny@0",
        )
        return Trajectory(choices=[choice], reward=reward)

    rewards = [[1.0, 0.0, 0.5, 0.0], [0.2, 0.9, 0.4], [1.0, 1.0, 1.0], [0.0, 1.0]]
    return [TrajectoryGroup(trajectories=[trajectory(r) for r in g]) for g in rewards]


def _adapter(trainer: LoraTrainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


@pytest.fixture(scope="module")
def ranks(tiny_model):
    trainer = DistributedTrainer(
        tiny_model, CONFIG, ranks=2, start_timeout_s=300, call_timeout_s=120
    )
    yield trainer
    trainer.close()


def test_sequences_are_dealt_to_ranks_by_token_count():
    sequences = [TrainSequence([1] * n, [1] * n, [0.0] * n, 1.0, str(n)) for n in (9, 7, 5, 3, 1)]
    shares = split_by_tokens(sequences, 2)
    assert [[len(s.token_ids) for s in share] for share in shares] == [[9, 3, 1], [7, 5]]
    assert split_by_tokens(sequences[:1], 3)[1:] == [[], []]  # ranks without rows


def test_two_ranks_match_the_single_process_step(tiny_model, ranks, tmp_path):
    groups = _groups(0)
    single = LoraTrainer(tiny_model, CONFIG, device="cpu")
    before = _adapter(single)
    expected = single.step(groups)
    got = ranks.step(groups)

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
    assert expected.groups_skipped_no_variance == 1 and expected.trained
    for name in ("loss", "grad_norm", "clip_fraction", "kl", "mean_ratio"):
        assert getattr(got, name) == pytest.approx(getattr(expected, name), rel=1e-5, abs=1e-7)

    ranks.save_adapter(tmp_path)
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "adapter_model.safetensors"))
    after = {k.replace(".default", ""): v for k, v in _adapter(single).items()}
    assert set(saved) == set(after)
    for key, value in after.items():
        moved = not torch.equal(value, before[key.replace(".weight", ".default.weight")])
        assert moved, f"{key} did not change in the single-process step"
        torch.testing.assert_close(saved[key], value, rtol=1e-5, atol=1e-7, msg=key)


def test_checkpoint_is_written_once_and_resumes(tiny_model, ranks, tmp_path):
    groups = _groups(1)
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

    # The single process's checkpoint loaded into the ranks; both take the same next step.
    ranks.load(tmp_path / "single")
    next_groups = _groups(2)
    expected = reference.step(next_groups)
    got = ranks.step(next_groups)
    assert got.loss == pytest.approx(expected.loss, rel=1e-5, abs=1e-7)
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
    set by hand, so no engine is started): `cpu_train_ranks=2` makes the ranks."""
    backend = LocalBackend(
        tmp_path, engine={"kind": "transformers", "placement": {"cpu_train_ranks": 2}}
    )
    backend._model_path = tiny_model
    model = TrainableModel("tiny", "distributed", config=CONFIG)
    try:
        trainer = backend._trainer(model)
        assert isinstance(trainer, DistributedTrainer)
        assert trainer.log_file.parent == tmp_path / "logs"
        os.kill(trainer.worker_pids[1], signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(TrainerError, match="training ranks failed during step") as error:
            trainer.step(_groups(0))
        assert time.monotonic() - started < 30
        assert str(trainer.log_file) in str(error.value) and "fix:" in str(error.value)
        with pytest.raises(TrainerError, match="stopped"):
            trainer.save_adapter(tmp_path)
        replacement = backend._trainer(model)  # the next step gets new ranks
        assert replacement is not trainer and not replacement.closed
    finally:
        await backend.close()
    assert replacement.closed
