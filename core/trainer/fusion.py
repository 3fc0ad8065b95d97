"""GPU speed-ups of the LoRA step: one fused LoRA linear, and each decoder layer compiled.

A profile of the eager step on an H200 (README, "Performance on an H200") spent a third
of the GPU's time in small element-wise kernels between the matrix products: RMSNorm,
RoPE, SwiGLU and dtype casts in transformers' eager modelling, and peft's LoRA epilogue
(`result + lora_B(lora_A(x)) * scaling`: two more full passes over every linear layer's
output). Two changes attack that, both applied by the trainer on a GPU only and each
switched off by its own `TrainConfig` field:

- `fuse_lora_linears` (`fused_lora`): each peft LoRA linear computes its low-rank update
  straight into the base layer's output, `y.addmm_(x @ A^T, B^T, alpha=scaling)`, so the
  scaling and the residual add happen in the matmul's epilogue instead of in two kernels
  over [tokens x out_features]. Anything but the plain case (adapter disabled or merged,
  several adapters, DoRA and other variants, extra arguments) goes through peft's own
  forward unchanged, so the reference pass (`disable_adapter`) still works.
- `compile_decoder_layers` (`compile_layers`): `torch.compile` of each decoder layer
  ("regional" compilation: layers share one compiled graph, so compiling costs one layer,
  not the whole model). Inductor fuses the element-wise chains into a few Triton kernels.
  Attention itself stays eager (`segment_attention` is excluded from the graph): its loop
  over the sequences of a packed row depends on the row's boundaries, which change every
  step and would otherwise recompile the layer every step. Row lengths change too, so
  the layers are compiled with a dynamic length from the start.

Both keep parameter names, so peft's adapter saving and loading are unchanged. On the CPU
the trainer applies neither (inductor's CPU code generation takes minutes on a small
machine and gains little there); the unit tests check them on the CPU directly, with
`backend="aot_eager"` for the compiled path.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["compile_decoder_layers", "fuse_lora_linears"]


def _fused_lora_forward(module: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """A peft `lora.Linear` forward with the LoRA update in the base matmul's epilogue."""
    active = module.active_adapters
    plain = (
        not args and not kwargs and not module.disable_adapters and not module.merged
        and len(active) == 1 and active[0] in module.lora_A
        and active[0] not in module.lora_variant
        and isinstance(module.base_layer, torch.nn.Linear)
    )  # fmt: skip
    if not plain:
        return type(module).forward(module, x, *args, **kwargs)
    name = active[0]
    base = module.base_layer
    x_NI = x.reshape(-1, x.shape[-1])
    y_NO = F.linear(x_NI, base.weight, base.bias)
    down_NR = F.linear(module.lora_dropout[name](x_NI), module.lora_A[name].weight)
    # In place on the base output: F.linear's backward needs its inputs, not its output.
    # Under autocast addmm_ runs in the output's dtype (bf16), like peft's own matmuls.
    y_NO = y_NO.addmm_(down_NR.to(y_NO.dtype), module.lora_B[name].weight.t().to(y_NO.dtype),
                       alpha=module.scaling[name])  # fmt: skip
    return y_NO.view(*x.shape[:-1], y_NO.shape[-1])


def fuse_lora_linears(model: torch.nn.Module) -> int:
    """Give every peft LoRA linear of `model` the fused forward; returns how many."""
    from peft.tuners.lora import Linear as LoraLinear

    fused = 0
    for module in model.modules():
        if type(module) is LoraLinear:  # subclasses (quantized bases) keep their own
            module.forward = types.MethodType(_fused_lora_forward, module)
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
