"""One checkpoint loader for every trainer (trainer/checkpoint.py): a round trip, and a
`CheckpointError` with the fix for a folder that is missing, unreadable or for another
adapter. Real `LoraTrainer`s on a tiny random-weight Llama (tests/tiny_llama.py); the
torchrun ranks run the same loader in tests/integration/test_distributed_trainer.py."""

import pytest
import torch
from tiny_llama import tiny_groups

from rlcoach.config import LoraConfig, TrainConfig
from rlcoach.errors import CheckpointError
from rlcoach.trainer.base import Trainer
from rlcoach.trainer.checkpoint import ADAPTER_FILE, OPTIMIZER_FILE
from rlcoach.trainer.lora import LoraTrainer

CONFIG = TrainConfig(learning_rate=1e-3, micro_batch_tokens=64, seed=3)


@pytest.fixture(scope="module")
def trained(tiny_model, tmp_path_factory):
    """A trainer after one step, and its checkpoint folder."""
    trainer = LoraTrainer(tiny_model, CONFIG, device="cpu")
    trainer.step(tiny_groups(0))
    folder = tmp_path_factory.mktemp("checkpoint")
    trainer.save(folder)
    return trainer, folder


def _state(trainer: LoraTrainer) -> dict[str, torch.Tensor]:
    adapter = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
    state = trainer.optimizer.state_dict()["state"]
    moments = {f"{i}.{k}": v for i, per_param in state.items() for k, v in per_param.items()}
    return {**adapter, **moments}


def test_a_checkpoint_resumes_the_adapter_and_the_optimizer_exactly(tiny_model, trained):
    trainer, folder = trained
    resumed = LoraTrainer(tiny_model, CONFIG.model_copy(update={"seed": 4}), device="cpu")
    assert isinstance(resumed, Trainer)  # what LocalBackend holds it as
    resumed.load(folder)
    want, got = _state(trainer), _state(resumed)
    assert set(got) == set(want) and any(".exp_avg" in k for k in got)
    for key, value in want.items():
        assert torch.equal(got[key], value), key
    # The next step is the same step.
    assert resumed.step(tiny_groups(1)).loss == trainer.step(tiny_groups(1)).loss


def test_a_missing_or_unreadable_checkpoint_names_the_fix(tiny_model, trained, tmp_path):
    trainer = LoraTrainer(tiny_model, CONFIG, device="cpu")
    with pytest.raises(CheckpointError, match=f"has no {ADAPTER_FILE}; fix: pass") as error:
        trainer.load(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(error.value)
    (tmp_path / ADAPTER_FILE).write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match=r"cannot be read .*fix: delete the folder"):
        trainer.load(tmp_path)


def test_a_checkpoint_of_another_adapter_does_not_fit_and_changes_nothing(
    tiny_model, trained, tmp_path
):
    _, folder = trained
    narrower = LoraTrainer(
        tiny_model, CONFIG.model_copy(update={"lora": LoraConfig(rank=4)}), "cpu"
    )
    before = _state(narrower)
    shapes = r"has shape \(8, 64\) in the checkpoint and \(4, 64\) in the model"
    with pytest.raises(CheckpointError, match=shapes):
        narrower.load(folder)
    assert all(torch.equal(value, before[key]) for key, value in _state(narrower).items())
    fewer = LoraTrainer(
        tiny_model, CONFIG.model_copy(update={"lora": LoraConfig(target_modules=["q_proj"])}), "cpu"
    )
    with pytest.raises(CheckpointError, match=r"adapter weights differ .*fix: load a checkpoint"):
        fewer.load(folder)


def test_optimizer_state_for_other_parameters_does_not_fit(tiny_model, trained, tmp_path):
    trainer, folder = trained
    for name in ("adapter_config.json", ADAPTER_FILE):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    saved = torch.load(folder / OPTIMIZER_FILE)
    saved["param_groups"][0]["params"] = saved["param_groups"][0]["params"][:-1]
    torch.save(saved, tmp_path / OPTIMIZER_FILE)
    with pytest.raises(CheckpointError, match=r"optimizer state is for .* parameters.*fix:"):
        trainer.load(tmp_path)


def test_the_serving_copy_is_what_peft_writes_in_the_engines_dtype(trained, tmp_path):
    """The publish's own writer (`save_serving_adapter`: one host copy, no model card)
    writes the files peft's `save_pretrained` would, key for key and value for value."""
    import json

    from safetensors.torch import load_file

    from rlcoach.trainer.lora import serving_dtype

    trainer, _ = trained
    ours, peft_own = tmp_path / "ours", tmp_path / "peft"
    ours.mkdir()
    trainer.save_adapter(ours, serving=True)
    dtype = serving_dtype(trainer.model)
    named = {
        n: p.detach().to(dtype) for n, p in trainer.model.named_parameters() if p.requires_grad
    }
    trainer.model.save_pretrained(peft_own, state_dict=named)
    mine, theirs = load_file(ours / ADAPTER_FILE), load_file(peft_own / ADAPTER_FILE)
    assert mine.keys() == theirs.keys() and len(mine) > 0
    assert all(mine[k].dtype == dtype and torch.equal(mine[k], theirs[k]) for k in mine)
    configs = [json.loads((f / "adapter_config.json").read_text()) for f in (ours, peft_own)]
    for config in configs:  # a set in peft, written in its iteration order
        config["target_modules"] = sorted(config["target_modules"])
    assert configs[0] == configs[1] and configs[0]["inference_mode"] is True
