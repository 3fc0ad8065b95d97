"""What the machine's processor can do fast, where it changes a numeric choice.

bf16 matmuls are fast on GPUs and on CPUs with bf16 instructions (AVX512-BF16, AMX);
elsewhere (an AVX2-only CPU, say) PyTorch falls back to a generic kernel that was
measured here 300-1000x slower than fp32 (a 188 x 576 x 49152 projection: 60 s in bf16
against about 0.1 s in fp32). So bf16 autocast and bf16 weights are used only where they
are fast, and everything else runs in fp32: on a CPU the trainer steps under bf16
autocast (`autocast`) where `fast_bf16("cpu")` holds and in plain fp32 where it does not,
and the engines pick their dtype from the same answer.

The CPU's answer can be forced with the environment variable `RLCOACH_CPU_BF16`:

- `RLCOACH_CPU_BF16=1`: take the bf16 path on any CPU (as on one with bf16 instructions);
- `RLCOACH_CPU_BF16=0`: take the fp32 path on any CPU (as on an AVX2-only one);
- unset or empty: ask the CPU (oneDNN's bf16 support check).

It exists so one machine can run the tests (or a run) the way the other kind of CPU
would: `RLCOACH_CPU_BF16=0 make test` on an AVX-512/bf16 machine is an AVX2 machine's
run. Forcing `1` on a CPU without bf16 instructions runs the slow fallback kernel: fine
for a tiny test model, hours for a real one. GPUs always take bf16; the variable does not
touch them. Any other value raises `ConfigError`.
"""

from __future__ import annotations

import functools
import os

import torch

from rlcoach.errors import ConfigError

__all__ = ["CPU_BF16_ENV", "autocast", "autocast_dtype", "cpu_bf16", "fast_bf16", "upload"]

CPU_BF16_ENV = "RLCOACH_CPU_BF16"
"""The environment variable that forces the CPU's bf16 decision (`0` or `1`)."""


@functools.cache
def _cpu_has_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def cpu_bf16() -> bool:
    """Whether the CPU takes the bf16 path: `RLCOACH_CPU_BF16` if set, else the CPU's own
    bf16 support (read on every call, so a test can set the variable)."""
    forced = os.environ.get(CPU_BF16_ENV, "").strip()
    if not forced:
        return _cpu_has_bf16()
    if forced not in ("0", "1"):
        raise ConfigError(
            f"{CPU_BF16_ENV}={forced!r}: it forces the CPU's bf16 decision and takes only "
            f"0 (fp32) or 1 (bf16 autocast); fix: set {CPU_BF16_ENV}=0 or 1, or unset it "
            "to let the CPU decide"
        )
    return forced == "1"


def fast_bf16(device: torch.device | str) -> bool:
    """True when bf16 matmuls on `device` are at least as fast as fp32 ones (on a CPU:
    `cpu_bf16()`, which `RLCOACH_CPU_BF16` can force)."""
    kind = torch.device(device).type
    if kind == "cuda":
        return True
    return kind == "cpu" and cpu_bf16()


def autocast_dtype(device: torch.device | str) -> torch.dtype:
    """The dtype the trainer's matmuls run in on `device`: bf16 where it is fast, else fp32."""
    return torch.bfloat16 if fast_bf16(device) else torch.float32


def autocast(device: torch.device | str) -> torch.autocast:
    """The trainer's autocast on `device`: bf16 where it is fast, off (fp32) elsewhere."""
    kind = torch.device(device).type
    return torch.autocast(kind, dtype=torch.bfloat16, enabled=fast_bf16(device))


def upload(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A host tensor on `device` without stalling a GPU: copied through pinned memory and
    not waited for. A copy from pageable memory makes the GPU's stream synchronise first,
    which leaves the GPU idle until the host queues the next kernel; the pinned buffer is
    kept by torch's host allocator until the copy has run. Elsewhere a plain `.to`."""
    if torch.device(device).type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
