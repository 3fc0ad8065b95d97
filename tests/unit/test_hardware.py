"""The trainer's hardware decision, taken both ways on whatever CPU runs the tests.

`RLCOACH_CPU_BF16` is the real switch (hardware.py), not a stand-in: each path runs a
real LoRA step of `LoraTrainer` on a tiny random-weight Llama (tests/tiny_llama.py), and
a forward hook on one base projection records the dtype its matmul ran in.
"""

import math

import pytest
import torch
from tiny_llama import tiny_groups

from rlcoach.config import TrainConfig
from rlcoach.errors import ConfigError
from rlcoach.runtime.hardware import (
    CPU_BF16_ENV,
    _cpu_has_bf16,
    autocast_dtype,
    cpu_bf16,
    fast_bf16,
)
from rlcoach.trainer.lora import LoraTrainer


def test_the_cpu_decision_is_the_cpus_unless_forced(monkeypatch):
    monkeypatch.delenv(CPU_BF16_ENV, raising=False)
    assert cpu_bf16() is _cpu_has_bf16()
    for value, want in [("0", False), ("1", True), (" 1 ", True), ("", _cpu_has_bf16())]:
        monkeypatch.setenv(CPU_BF16_ENV, value)
        assert cpu_bf16() is want and fast_bf16("cpu") is want, value
        assert autocast_dtype("cpu") == (torch.bfloat16 if want else torch.float32), value
    monkeypatch.setenv(CPU_BF16_ENV, "0")
    assert fast_bf16("cuda") is True  # GPUs always take bf16: the variable is the CPU's


@pytest.mark.parametrize("value", ["yes", "2", "bf16"])
def test_a_bad_value_is_refused_naming_it_and_the_fix(monkeypatch, value):
    monkeypatch.setenv(CPU_BF16_ENV, value)
    with pytest.raises(ConfigError, match=f"{CPU_BF16_ENV}='{value}'") as error:
        fast_bf16("cpu")
    assert "fix: set RLCOACH_CPU_BF16=0 or 1" in str(error.value)


@pytest.mark.parametrize(("forced", "dtype"), [("0", torch.float32), ("1", torch.bfloat16)])
def test_a_step_runs_in_the_decided_dtype(monkeypatch, tiny_model, forced, dtype):
    monkeypatch.setenv(CPU_BF16_ENV, forced)
    config = TrainConfig(learning_rate=1e-3, micro_batch_tokens=64, kl_coef=0.05, seed=3)
    trainer = LoraTrainer(tiny_model, config, device="cpu")
    projection = trainer.model.get_base_model().model.layers[0].self_attn.q_proj.base_layer
    seen = []
    projection.register_forward_hook(
        lambda module, args, out: seen.append((torch.is_autocast_enabled("cpu"), out.dtype))
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}

    stats = trainer.step(tiny_groups(0))

    assert stats.trained and stats.sampled_tokens > 0
    assert math.isfinite(stats.loss) and math.isfinite(stats.grad_norm) and stats.grad_norm > 0
    assert seen and set(seen) == {(forced == "1", dtype)}
    for name, param in trainer.model.named_parameters():
        if "lora_B" in name:  # zero at init: any step moves it
            assert torch.isfinite(param).all() and not torch.equal(param, before[name]), name
