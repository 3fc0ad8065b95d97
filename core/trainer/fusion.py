"""GPU speed-ups of the LoRA step: a fused LoRA linear, compiled decoder layers, and a
log-prob whose gradient is computed in the forward pass.

A profile of the eager step on an H200 (docs/benchmarks-gpu.md) spent a third
of the GPU's time in small element-wise kernels between the matrix products: RMSNorm,
RoPE, SwiGLU and dtype casts in transformers' eager modelling, and peft's LoRA epilogue
(`result + lora_B(lora_A(x)) * scaling`: two more full passes over every linear layer's
output). The trainer applies these on a GPU only, each behind its own `TrainConfig` field:

- `fuse_lora_linears` (`fused_lora`, on): each peft LoRA linear computes its low-rank
  update straight into the base layer's output, `y.addmm_(x @ A^T, B^T, alpha=scaling)`,
  so the scaling and the residual add happen in the matmul's epilogue instead of in two
  kernels over [tokens x out_features]. Anything but the plain case (adapter disabled or
  merged, several adapters, DoRA and other variants, extra arguments) goes through peft's
  own forward unchanged, so the reference pass (`disable_adapter`) still works.
- `compile_decoder_layers` (`compile_layers`, on): `torch.compile` of each decoder layer
  ("regional" compilation: layers share one compiled graph, so compiling costs one layer,
  not the whole model). Inductor fuses the element-wise chains into a few Triton kernels.
  Attention itself stays eager (`segment_attention` is excluded from the graph): its loop
  over the sequences of a packed row depends on the row's boundaries, which change every
  step and would otherwise recompile the layer every step. Row lengths change too, so the
  layers are compiled with a dynamic length from the start. The same field compiles the
  vocabulary projection of lora.py.
- `TargetLogprob` (`fused_logprob`, on; checked on the CPU, measured on an H100):
  the log-prob of each target token under the frozen output layer, with its gradient
  computed in the forward pass. A log-prob is one number per token, so its gradient with
  respect to the hidden state is a fixed vector, `W[target] - softmax(logits) @ W`, that
  the backward pass only scales. That replaces the checkpointed projection (the [tokens x
  vocab] logits computed twice, then softmax's backward over them) by one more matmul in
  the forward pass and a [tokens x hidden] fp32 tensor kept for the backward.

All keep parameter names, so peft's adapter saving and loading are unchanged. On the CPU
the trainer applies none (inductor's CPU code generation takes minutes on a small machine
and gains little there); the unit tests check them on the CPU directly, with
`backend="aot_eager"` for the compiled layers.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import torch
import torch.nn.functional as F

__all__ = [
    "TargetLogprob",
    "compile_decoder_layers",
    "compiled_target_logprob",
    "fuse_lora_linears",
]


def _fused_lora_forward(module: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """A peft `lora.Linear` forward with the LoRA update in the base matmul's epilogue."""
    active = module.active_adapters
    plain = (
        not args
        and not kwargs
        and not module.disable_adapters
        and not module.merged
        and len(active) == 1
        and active[0] in module.lora_A
        and active[0] not in module.lora_variant
        and isinstance(module.base_layer, torch.nn.Linear)
    )
    if not plain:
        return type(module).forward(module, x, *args, **kwargs)
    name = active[0]
    base = module.base_layer
    x_NI = x.reshape(-1, x.shape[-1])
    y_NO = F.linear(x_NI, base.weight, base.bias)
    down_NR = F.linear(module.lora_dropout[name](x_NI), module.lora_A[name].weight)
    # In place on the base output: F.linear's backward needs its inputs, not its output.
    # Under autocast addmm_ runs in the output's dtype (bf16), like peft's own matmuls.
    y_NO = y_NO.addmm_(
        down_NR.to(y_NO.dtype),
        module.lora_B[name].weight.t().to(y_NO.dtype),
        alpha=module.scaling[name],
    )
    return y_NO.view(*x.shape[:-1], y_NO.shape[-1])


def fuse_lora_linears(model: torch.nn.Module) -> int:
    """Give every peft LoRA linear of `model` the fused forward; returns how many."""
    from peft.tuners.lora import Linear as LoraLinear

    fused = 0
    for module in model.modules():
        if type(module) is LoraLinear:  # subclasses (quantized bases) keep their own
            module.forward = types.MethodType(_fused_lora_forward, module)  # type: ignore[method-assign]  # this instance's own
            fused += 1
    return fused


def compile_decoder_layers(model: torch.nn.Module, backend: str = "inductor") -> int:
    """`torch.compile` each decoder layer of a transformers causal LM (in place, names
    kept); returns how many layers were compiled (0 when none were found)."""
    from rlcoach.trainer.attention import exclude_from_compilation

    exclude_from_compilation()
    layers = _decoder_layers(model)
    for layer in layers:
        # dynamic=True: row lengths change every step; a first static compile would only
        # be thrown away at the second length (and cost a slot of the recompile limit).
        layer.compile(backend=backend, dynamic=True)
    return len(layers)


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    for module in model.modules():
        layers = getattr(module, "layers", None)
        if isinstance(layers, torch.nn.ModuleList) and len(layers) > 0:
            return list(layers)
    return []


class TargetLogprob(torch.autograd.Function):
    """`log_softmax(h_CH @ weight_VH^T)[c, t_C[c]]` for a frozen `weight_VH`, shape [C]
    (fp32); the gradient with respect to `h_CH` is computed in the forward pass."""

    @staticmethod
    def forward(
        ctx: Any, h_CH: torch.Tensor, weight_VH: torch.Tensor, t_C: torch.Tensor
    ) -> torch.Tensor:
        ctx.h_dtype = h_CH.dtype
        logits_CV = (h_CH.to(weight_VH.dtype) @ weight_VH.t()).float()
        lse_C = torch.logsumexp(logits_CV, dim=-1)
        logprob_C = logits_CV.gather(-1, t_C[:, None])[:, 0] - lse_C
        if ctx.needs_input_grad[0]:
            probs_CV = torch.exp(logits_CV - lse_C[:, None]).to(weight_VH.dtype)
            ctx.save_for_backward(weight_VH[t_C].float() - (probs_CV @ weight_VH).float())
        return logprob_C

    @staticmethod
    def backward(ctx: Any, grad_C: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        (jacobian_CH,) = ctx.saved_tensors
        return (grad_C[:, None] * jacobian_CH).to(ctx.h_dtype), None, None


def _target_logprob(h_CH: torch.Tensor, weight_VH: torch.Tensor, t_C: torch.Tensor) -> torch.Tensor:
    return TargetLogprob.apply(h_CH, weight_VH, t_C)


@functools.cache
def compiled_target_logprob() -> Any:
    """`TargetLogprob` through `torch.compile` (chunk lengths vary: dynamic shapes)."""
    return torch.compile(_target_logprob, dynamic=True)
