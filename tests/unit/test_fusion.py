"""The GPU speed-ups of the trainer (trainer/fusion.py), checked on the CPU.

The trainer applies them on a GPU only, which CI does not have. Here they run on the CPU
on a tiny random Qwen3 with a LoRA adapter: the fused LoRA forward against peft's own,
and the compiled decoder layers against eager ones. The compiled path uses
`backend="aot_eager"`: the same graph capture, graph breaks, guards and autograd as on
the GPU, without inductor's code generation (minutes on this CPU); inductor's kernels
themselves are only checked on the GPU, by the benchmark.
"""

import pytest
import torch

from rlcoach.config import TrainConfig
from rlcoach.trainer.attention import SEGMENT_ATTENTION, register_segment_attention
from rlcoach.trainer.fusion import TargetLogprob, compile_decoder_layers, fuse_lora_linears
from rlcoach.trainer.lora import _project, chunked_token_logprobs


def _tiny_lora_model():
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen3Config

    register_segment_attention()
    config = Qwen3Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=512,
        use_cache=False,
    )
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(config, attn_implementation=SEGMENT_ATTENTION)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    for name, parameter in model.named_parameters():
        if "lora_B" in name:  # peft starts B at zero, which would hide a wrong update
            torch.nn.init.normal_(parameter, std=0.1)
    return model


def _row(lengths):
    generator = torch.Generator().manual_seed(sum(lengths))
    positions_T = torch.cat([torch.arange(n) for n in lengths])
    return torch.randint(0, 512, (1, positions_T.shape[0]), generator=generator), positions_T[None]


def _logprobs_and_grads(model, ids, positions):
    model.zero_grad(set_to_none=True)
    logprobs = chunked_token_logprobs(model.get_base_model(), ids, positions, 16)
    (logprobs * torch.linspace(-1, 1, logprobs.shape[0])).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return logprobs.detach(), grads


def _assert_same(got, want):
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-4)
    assert got[1].keys() == want[1].keys()
    for name in want[1]:
        torch.testing.assert_close(got[1][name], want[1][name], atol=1e-5, rtol=1e-4, msg=name)


def test_fused_lora_gives_peft_log_probs_and_gradients():
    model = _tiny_lora_model()
    ids, positions = _row((30, 20, 13))
    want = _logprobs_and_grads(model, ids, positions)
    with torch.no_grad(), model.disable_adapter():
        want_base = chunked_token_logprobs(model.get_base_model(), ids, positions, 16)
    assert fuse_lora_linears(model) == 2 * 7  # every linear layer of both decoder layers
    _assert_same(_logprobs_and_grads(model, ids, positions), want)
    with torch.no_grad(), model.disable_adapter():  # the reference pass falls back to peft
        got_base = chunked_token_logprobs(model.get_base_model(), ids, positions, 16)
    torch.testing.assert_close(got_base, want_base, atol=0, rtol=0)


def test_compiled_layers_match_eager_and_do_not_recompile_per_row():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    model = _tiny_lora_model()
    rows = [_row(lengths) for lengths in ((30, 20, 13), (50,), (7, 8, 9, 40), (12, 30))]
    want = [_logprobs_and_grads(model, ids, positions) for ids, positions in rows]
    fuse_lora_linears(model)
    assert compile_decoder_layers(model.get_base_model(), backend="aot_eager") == 2
    try:
        _assert_same(_logprobs_and_grads(model, *rows[0]), want[0])
        graphs = counters["stats"]["unique_graphs"]
        assert graphs > 0  # the layers really went through dynamo
        for (ids, positions), expected in zip(rows[1:], want[1:], strict=True):
            _assert_same(_logprobs_and_grads(model, ids, positions), expected)
        # New lengths and new sequence boundaries reuse the graphs of the first row.
        assert counters["stats"]["unique_graphs"] == graphs
    finally:
        torch._dynamo.reset()


def test_target_logprob_gives_the_projections_values_and_gradient():
    torch.manual_seed(0)
    head = torch.nn.Linear(32, 500, bias=False).requires_grad_(False)
    h_CH = torch.randn(24, 32, requires_grad=True)
    t_C = torch.randint(0, 500, (24,))
    weight_C = torch.linspace(-1, 1, 24)
    want = _project(head, h_CH, t_C)
    (want_grad,) = torch.autograd.grad((want * weight_C).sum(), h_CH)
    got = TargetLogprob.apply(h_CH, head.weight, t_C)
    (got_grad,) = torch.autograd.grad((got * weight_C).sum(), h_CH)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_grad, want_grad, atol=1e-5, rtol=1e-4)
    with torch.no_grad():  # the reference pass keeps no gradient
        torch.testing.assert_close(TargetLogprob.apply(h_CH, head.weight, t_C), want.detach())


@pytest.mark.parametrize("field", ["compile_layers", "fused_lora", "fused_logprob"])
def test_gpu_speed_ups_are_on_by_default_and_can_be_turned_off(field):
    assert getattr(TrainConfig(), field) is True
    assert getattr(TrainConfig(**{field: False}), field) is False


def test_the_cpu_trainer_leaves_the_model_eager(model_path):
    from rlcoach.trainer.lora import LoraTrainer

    if torch.cuda.is_available():
        pytest.skip("checks the CPU path")
    trainer = LoraTrainer(model_path, TrainConfig())
    modules = list(trainer.model.modules())
    assert not any("forward" in vars(m) for m in modules)  # no fused forward bound
    assert not any(getattr(m, "_compiled_call_impl", None) for m in modules)
