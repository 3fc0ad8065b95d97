"""Attention forward + backward of one packed row, by sdpa backend and input layout.

The trainer's per-sequence attention (core/trainer/attention.py) leaves the choice of
kernel to sdpa. This measures what each choice costs on the Qwen3-4B shape (32 query
heads, 8 key/value heads, head size 128), one row of `--sequences` x `--length` tokens:

  python bench/gpu/attention.py --sequences 4 --length 4096
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def _segments(q, k, v, bounds, gqa):
    pieces = [
        F.scaled_dot_product_attention(
            q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], is_causal=True, enable_gqa=gqa
        )
        for s, e in itertools.pairwise(bounds)
    ]
    return torch.cat(pieces, dim=2).transpose(1, 2).contiguous()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sequences", type=int, default=4)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    heads, kv_heads, dim = 32, 8, 128
    total = args.sequences * args.length
    bounds = tuple(range(0, total + 1, args.length))
    torch.manual_seed(0)
    # As transformers makes them: [1, T, H, D] projections viewed as [1, H, T, D].
    q0 = torch.randn(1, total, heads, dim, device="cuda", dtype=torch.bfloat16)
    k0 = torch.randn(1, total, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
    v0 = torch.randn(1, total, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
    grad = torch.randn(1, total, heads, dim, device="cuda", dtype=torch.bfloat16)

    def run(name, fn, backend=None):
        q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))

        def once():
            with sdpa_kernel([backend]) if backend is not None else torch.enable_grad():
                out = fn(q, k, v)
            out.backward(grad.reshape(out.shape))

        try:
            once()
            torch.cuda.synchronize()
            started = time.perf_counter()
            for _ in range(args.iters):
                once()
            torch.cuda.synchronize()
        except RuntimeError as e:
            print(f"{name:44} failed: {str(e).splitlines()[0][:100]}", flush=True)
            return
        ms = 1000 * (time.perf_counter() - started) / args.iters
        print(f"{name:44} {ms:7.2f} ms fwd+bwd per layer", flush=True)

    def views(q, k, v):
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    run(
        "default backend, views, enable_gqa",
        lambda q, k, v: _segments(*views(q, k, v), bounds, True),
    )
    for backend in (
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
    ):
        run(
            f"{backend.name}, views, enable_gqa",
            lambda q, k, v: _segments(*views(q, k, v), bounds, True),
            backend,
        )

        def expanded(q, k, v):
            q, k, v = views(q, k, v)
            k = k.repeat_interleave(heads // kv_heads, dim=1)
            v = v.repeat_interleave(heads // kv_heads, dim=1)
            return _segments(q, k, v, bounds, False)

        run(f"{backend.name}, views, k/v repeated", expanded, backend)

        def contiguous(q, k, v):
            q, k, v = (t.contiguous() for t in views(q, k, v))
            return _segments(q, k, v, bounds, True)

        run(f"{backend.name}, contiguous, enable_gqa", contiguous, backend)
    try:
        from torch.nn.attention import varlen
    except ImportError:
        print("varlen_attn: not in this torch")
        return
    signature = inspect.signature(varlen.varlen_attn)
    print("varlen_attn", signature)
    cu = torch.tensor(bounds, device="cuda", dtype=torch.int32)
    extra = {"is_causal": True} if "is_causal" in signature.parameters else {}
    if "window_size" in signature.parameters:
        extra["window_size"] = (-1, 0)
    if "enable_gqa" in signature.parameters:
        extra["enable_gqa"] = True

    def varlen_fn(q, k, v):
        return varlen.varlen_attn(q[0], k[0], v[0], cu, cu, args.length, args.length, **extra)

    run("varlen_attn [T, H, D]", varlen_fn)

    def varlen_repeated(q, k, v):
        k = k[0].repeat_interleave(heads // kv_heads, dim=1)
        v = v[0].repeat_interleave(heads // kv_heads, dim=1)
        return varlen.varlen_attn(
            q[0],
            k,
            v,
            cu,
            cu,
            args.length,
            args.length,
            **{n: x for n, x in extra.items() if n != "enable_gqa"},
        )

    run("varlen_attn [T, H, D], k/v repeated", varlen_repeated)


if __name__ == "__main__":
    main()
