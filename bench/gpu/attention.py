"""Attention forward + backward of one packed row, by sdpa backend and input layout.

The trainer's per-sequence attention (core/trainer/attention.py) leaves the choice of
kernel to sdpa. This measures what each choice costs on the Qwen3-4B shape (32 query
heads, 8 key/value heads, head size 128), one row of `--sequences` x `--length` tokens:

  python bench/gpu/attention.py --sequences 4 --length 4096

Then the trainer's own `segment_attention` on a pass of the whole-step benchmark (two
GRPO groups: a 131-token prompt once, then 8 suffixes of 384 tokens each; and the same
16 sequences unshared): the loop over pieces against one varlen call, their time and
the largest difference of output and q/k/v gradients (`--groups`, `--prompt`, `--reply`).
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
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=131)
    parser.add_argument("--reply", type=int, default=384)
    parser.add_argument("--per-group", type=int, default=8)
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
    compare_segment_attention(args, heads, kv_heads, dim)


def _attend(attention, module, qkv, table, grad):
    """segment_attention forward + backward; the output and the q/k/v gradients."""
    inputs = [t.detach().clone().requires_grad_() for t in qkv]
    out, _ = attention.segment_attention(module, *inputs, None, rlcoach_segments=table)
    out.backward(grad)
    return out.detach(), [t.grad for t in inputs]


def compare_segment_attention(args, heads: int, kv_heads: int, dim: int) -> None:
    from rlcoach.trainer import attention

    shared, plain, at = [], [], 0
    for _ in range(args.groups):
        shared.append((at, at + args.prompt, at, at))
        prefix, at = at, at + args.prompt
        for _ in range(args.per_group):
            shared.append((at, at + args.reply, prefix, prefix + args.prompt))
            at += args.reply
    at = 0
    for _ in range(args.groups * args.per_group):
        plain.append((at, at + args.prompt + args.reply, at, at))
        at += args.prompt + args.reply
    module = torch.nn.Module().eval()
    for name, pieces in (("shared prefixes", shared), ("plain", plain)):
        length = pieces[-1][1]
        torch.manual_seed(0)
        q0, k0, v0 = (
            torch.randn(1, length, h, dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
            for h in (heads, kv_heads, kv_heads)
        )
        grad = torch.randn(1, length, heads, dim, device="cuda", dtype=torch.bfloat16)
        table = torch.tensor(pieces)
        results = {}
        for varlen in (False, True):
            attention.USE_VARLEN = varlen
            results[varlen] = _attend(attention, module, (q0, k0, v0), table, grad)
            torch.cuda.synchronize()
            started = time.perf_counter()
            for _ in range(args.iters):
                _attend(attention, module, (q0, k0, v0), table, grad)
            torch.cuda.synchronize()
            ms = 1000 * (time.perf_counter() - started) / args.iters
            label = "varlen, one call" if varlen else "loop over pieces"
            print(f"segment_attention, {name}, {length} tokens, {label:18} {ms:7.2f} ms")
        (out_a, grads_a), (out_b, grads_b) = results[False], results[True]
        diffs = [(out_a - out_b).abs().max().item()] + [
            (a - b).abs().max().item() for a, b in zip(grads_a, grads_b, strict=True)
        ]
        scale = out_a.abs().max().item()
        print(
            f"segment_attention, {name}: largest |loop - varlen| output {diffs[0]:.3g} "
            f"(output up to {scale:.3g}), grad q {diffs[1]:.3g} k {diffs[2]:.3g} v {diffs[3]:.3g}",
            flush=True,
        )
    attention.USE_VARLEN = True


if __name__ == "__main__":
    main()
