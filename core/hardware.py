"""What the machine's processor can do fast, where it changes a numeric choice.

bf16 matmuls are fast on GPUs and on CPUs with bf16 instructions (AVX512-BF16, AMX);
elsewhere (an AVX2-only CPU, say) PyTorch falls back to a generic kernel that was
measured here 300-1000x slower than fp32 (a 188 x 576 x 49152 projection: 60 s in bf16
against about 0.1 s in fp32). So bf16 autocast and bf16 weights are used only where they
are fast, and everything else runs in fp32.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["fast_bf16"]


@functools.cache
def _cpu_has_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def fast_bf16(device: torch.device | str) -> bool:
    """True when bf16 matmuls on `device` are at least as fast as fp32 ones."""
    kind = torch.device(device).type
    if kind == "cuda":
        return True
    return kind == "cpu" and _cpu_has_bf16()
