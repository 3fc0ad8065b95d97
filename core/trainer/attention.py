"""Per-sequence causal attention for packed rows, without a [T x T] mask.

The trainer packs several sequences into one row (batch size 1) so that no token is
padding. Each sequence must attend only to itself. The plain way, a dense block-diagonal
boolean mask handed to `scaled_dot_product_attention`, costs T^2 memory and, because a
mask is given, keeps sdpa off its FlashAttention kernel on a GPU (it falls back to the
memory-efficient kernel reading the mask, or to the math kernel).

Here the row is cut at the sequence boundaries instead, and each piece goes through sdpa
with `is_causal=True` and no mask, which is the case FlashAttention serves (GQA included,
via `enable_gqa`). Memory is linear in T, and the work is the sum of the squares of the
sequence lengths rather than the square of the row length. The cost is a Python loop over
the row's sequences in each layer: a few launches per sequence, small next to the
matrix work once sequences are a few hundred tokens long.

It plugs into transformers as a registered attention implementation
(`SEGMENT_ATTENTION`): a model loaded with `attn_implementation=SEGMENT_ATTENTION` builds
no mask at all (transformers skips mask creation for implementations it does not know),
and the boundaries reach every layer as the `rlcoach_segments` keyword of the forward
call: the sequence start offsets followed by the row length [S+1], or the row's pieces
`(start, end, context_start, context_end)` as an [S, 4] table (a `PackedRow`'s
`segments`), as a tuple or as a CPU int64 tensor. The trainer passes the tensor (the
boundaries where the row shares no prefix): a compiled decoder layer (fusion.py) guards
on a tuple's length and values, so every new set of boundaries would recompile it, while
a tensor is a graph input whose values the guards ignore.

Shared prefixes (sequences.py): a piece with a context range is the suffix of a sequence
whose prefix another piece holds. Its queries attend to the prefix's keys and then to its
own, causally: [Q x (P+Q)] attention aligned bottom-right. sdpa's `is_causal` aligns
top-left when the query and key lengths differ, so that case goes through a lower-right
causal bias on a GPU (FlashAttention) and an explicit [Q x (P+Q)] mask elsewhere.

On a GPU, where torch has `torch.nn.attention.varlen.varlen_attn` (FlashAttention over
cumulative sequence lengths), a layer's whole row is attended in one call instead of the
loop: the queries stay where they are, the keys and values of each piece are gathered
(a suffix's prefix, then its own) into one [K x H x D] tensor whose gradient scatters back
(summing over a prefix's suffixes), and the kernel's causal mask aligns bottom-right as a
suffix needs. A layer then launches a handful of kernels instead of a few per piece, and
the backward writes no zero-filled row per slice. The boundaries go to the GPU once per
row (pinned, without waiting), not once per layer.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import threading
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from rlcoach.runtime.hardware import upload

__all__ = [
    "SEGMENT_ATTENTION",
    "exclude_from_compilation",
    "register_segment_attention",
    "segment_attention",
    "segment_bounds",
]

SEGMENT_ATTENTION = "rlcoach_segments"
"""The attention implementation name a model must be loaded with to use this module."""


def segment_bounds(position_ids_T: torch.Tensor) -> tuple[int, ...]:
    """Start offsets of the sequences of a packed row (positions restart at 0), then T."""
    starts = torch.nonzero(position_ids_T == 0).flatten().tolist()
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    return (*starts, int(position_ids_T.shape[0]))


def _pieces(
    segments: tuple[int, ...] | tuple[tuple[int, ...], ...] | torch.Tensor | None, length: int
) -> list[tuple[int, int, int, int]]:
    """The `(start, end, context_start, context_end)` pieces of a row from any form of
    `rlcoach_segments` (boundaries [S+1], or pieces [S, 4])."""
    if segments is None:
        return [(0, length, 0, 0)]
    # A CPU tensor: reading it does not sync the GPU. Boundaries [S+1] or pieces [S, 4].
    listed: list[Any] = segments.tolist() if isinstance(segments, torch.Tensor) else list(segments)
    if listed and isinstance(listed[0], int):
        pieces = [(start, end, start, start) for start, end in itertools.pairwise(listed)]
    else:
        pieces = [(int(a), int(b), int(c), int(d)) for a, b, c, d in listed]
    if not pieces or max(end for _, end, _, _ in pieces) != length:
        raise ValueError(
            f"sequence boundaries {pieces[:2]}... do not end at the row length {length}; "
            "fix: build them with segment_bounds(position_ids) of the same row, or pass "
            "the PackedRow's segments"
        )
    return pieces


def _row_pieces(
    segments: tuple[int, ...] | tuple[tuple[int, ...], ...] | torch.Tensor | None, length: int
) -> list[tuple[int, int, int, int]]:
    """`_pieces`, read once per row: every layer of a pass gets the same `segments`
    object, so this thread's last one is kept (and held, so its id is not reused)."""
    last = getattr(_row_cache, "segments", None)
    if segments is not None and last is not None and last[0] is segments and last[1] == length:
        return last[2]
    pieces = _pieces(segments, length)
    _row_cache.segments = (segments, length, pieces)
    return pieces


def _lower_right_causal(
    query_1HQD: torch.Tensor,
    key_1KSD: torch.Tensor,
    value_1KSD: torch.Tensor,
    scale: float | None,
    dropout: float,
    gqa: bool,
    flash: bool,
) -> torch.Tensor:
    """Causal attention of Q queries over S >= Q keys, aligned bottom-right: query i sees
    keys up to S - Q + i (a suffix sees its whole prefix, then itself causally).

    sdpa's `is_causal` aligns top-left when Q != S, so it cannot be used here. With
    `flash` (on a GPU) the lower-right `CausalBias` runs FlashAttention (whose causal mask
    is bottom-right) when the heads match, so a GQA model's key heads are repeated for it;
    otherwise an explicit [Q x S] boolean mask, small for a suffix."""
    queries, keys = query_1HQD.shape[2], key_1KSD.shape[2]
    if flash:
        from torch.nn.attention.bias import causal_lower_right

        if gqa:
            repeat = query_1HQD.shape[1] // key_1KSD.shape[1]
            key_1KSD = key_1KSD.repeat_interleave(repeat, dim=1)
            value_1KSD = value_1KSD.repeat_interleave(repeat, dim=1)
        return F.scaled_dot_product_attention(
            query_1HQD,
            key_1KSD,
            value_1KSD,
            attn_mask=causal_lower_right(queries, keys),
            scale=scale,
            dropout_p=dropout,
        )
    allowed_QS = torch.ones(queries, keys, dtype=torch.bool, device=query_1HQD.device)
    return F.scaled_dot_product_attention(
        query_1HQD,
        key_1KSD,
        value_1KSD,
        attn_mask=allowed_QS.tril(diagonal=keys - queries),
        scale=scale,
        dropout_p=dropout,
        enable_gqa=gqa,
    )


def segment_attention(
    module: torch.nn.Module,
    query_1HTD: torch.Tensor,
    key_1KTD: torch.Tensor,
    value_1KTD: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    rlcoach_segments: tuple[int, ...] | tuple[tuple[int, ...], ...] | torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal attention within each piece of a packed row (a suffix also attends to its
    whole shared prefix); output [1, T, H, D]."""
    if attention_mask is not None:
        raise ValueError(
            f"{SEGMENT_ATTENTION!r} attention got an attention mask; it takes the sequence "
            "boundaries (`rlcoach_segments=`) instead — fix: pass attention_mask=None"
        )
    gqa = query_1HTD.shape[1] != key_1KTD.shape[1]
    flash = query_1HTD.is_cuda
    dropout = dropout if module.training else 0.0
    row_pieces = _row_pieces(rlcoach_segments, query_1HTD.shape[2])
    uploaded = _uploaded(row_pieces, query_1HTD) if dropout == 0.0 else None
    if uploaded is not None:
        return _varlen_attention(query_1HTD, key_1KTD, value_1KTD, uploaded, scaling, gqa), None
    tiled = all(a[1] == b[0] for a, b in itertools.pairwise(row_pieces)) and row_pieces[0][0] == 0
    if tiled and all(
        context_start == context_end for _, _, context_start, context_end in row_pieces
    ):
        # No shared prefix: the pieces tile the row in order, so `split` cuts them. Its
        # backward is one concatenation of the pieces' gradients, where a slice per piece
        # would fill a zero tensor of the whole row and add it, per piece and per layer
        # (element-wise work that grows with the square of the sequences in a pass).
        sizes = [end - start for start, end, _, _ in row_pieces]
        pieces = [
            F.scaled_dot_product_attention(
                q_1HSD,
                k_1KSD,
                v_1KSD,
                is_causal=True,
                scale=scaling,
                dropout_p=dropout,
                enable_gqa=gqa,
            )
            for q_1HSD, k_1KSD, v_1KSD in zip(
                query_1HTD.split(sizes, dim=2),
                key_1KTD.split(sizes, dim=2),
                value_1KTD.split(sizes, dim=2),
                strict=True,
            )
        ]
        out_1HTD = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=2)
        return out_1HTD.transpose(1, 2).contiguous(), None
    pieces = []
    for start, end, context_start, context_end in row_pieces:
        if context_start == context_end:
            pieces.append(
                F.scaled_dot_product_attention(
                    query_1HTD[:, :, start:end],
                    key_1KTD[:, :, start:end],
                    value_1KTD[:, :, start:end],
                    is_causal=True,
                    scale=scaling,
                    dropout_p=dropout,
                    enable_gqa=gqa,
                )
            )
            continue
        # A suffix: its keys are the shared prefix's, then its own. Every suffix reads
        # the prefix's keys and values, so their gradients sum over the suffixes.
        keys = torch.cat([key_1KTD[:, :, context_start:context_end], key_1KTD[:, :, start:end]], 2)
        values = torch.cat(
            [value_1KTD[:, :, context_start:context_end], value_1KTD[:, :, start:end]], 2
        )
        pieces.append(
            _lower_right_causal(
                query_1HTD[:, :, start:end], keys, values, scaling, dropout, gqa, flash
            )
        )
    out_1HTD = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=2)
    return out_1HTD.transpose(1, 2).contiguous(), None


class VarlenPlan(NamedTuple):
    """One row's pieces as the varlen kernel takes them: cumulative query and key lengths
    [S+1], the row positions of every piece's keys (its context, then itself; None when
    each piece's keys are its own queries' positions, in order) and the longest piece."""

    cu_queries: list[int]
    cu_keys: list[int]
    key_positions: list[int] | None
    max_queries: int
    max_keys: int


def varlen_plan(pieces: list[tuple[int, int, int, int]]) -> VarlenPlan | None:
    """The varlen kernel's view of a row's pieces; None when the pieces do not tile the
    row in order (the kernel reads the queries where they are)."""
    if pieces[0][0] != 0 or any(a[1] != b[0] for a, b in itertools.pairwise(pieces)):
        return None
    cu_queries, cu_keys = [0], [0]
    positions: list[int] = []
    for start, end, context_start, context_end in pieces:
        cu_queries.append(end)
        positions.extend(range(context_start, context_end))
        positions.extend(range(start, end))
        cu_keys.append(len(positions))
    shared = any(context_start != context_end for _, _, context_start, context_end in pieces)
    return VarlenPlan(
        cu_queries,
        cu_keys,
        positions if shared else None,
        max(b - a for a, b in itertools.pairwise(cu_queries)),
        max(b - a for a, b in itertools.pairwise(cu_keys)),
    )


USE_VARLEN = True
"""Attend a row in one varlen call where the GPU and torch allow it (False: the loop over
pieces, e.g. to compare the two in a benchmark)."""


@functools.cache
def _varlen_kernel() -> tuple[Any, dict[str, Any], bool] | None:
    """torch's varlen attention, the keyword that makes it causal, and whether it takes
    grouped key heads itself; None where this torch has none (its signature changed
    between releases: `is_causal`, then `window_size`)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    parameters = inspect.signature(varlen_attn).parameters
    if "is_causal" in parameters:
        causal: dict[str, Any] = {"is_causal": True}
    elif "window_size" in parameters:
        causal = {"window_size": (-1, 0)}
    else:
        return None
    return varlen_attn, causal, "enable_gqa" in parameters


def _varlen_serves(query_1HTD: torch.Tensor) -> bool:
    return (
        USE_VARLEN
        and query_1HTD.is_cuda
        and query_1HTD.dtype in (torch.bfloat16, torch.float16)
        and query_1HTD.shape[-1] <= 256
        and _varlen_kernel() is not None
    )


class _Uploaded(NamedTuple):
    pieces: tuple[tuple[int, int, int, int], ...]
    source: list[tuple[int, int, int, int]]
    """The list `pieces` was made from (`_row_pieces` hands every layer the same one)."""
    device: torch.device
    plan: VarlenPlan
    cu_queries: torch.Tensor
    cu_keys: torch.Tensor
    key_positions: torch.Tensor | None


_row_cache = threading.local()


def _uploaded(
    pieces: list[tuple[int, int, int, int]], query_1HTD: torch.Tensor
) -> _Uploaded | None:
    """The row's varlen plan on the query's device; None where the varlen call does not
    serve (no GPU, a torch without it, other dtypes, pieces out of order). Uploaded once
    per row: every layer of a pass (and a checkpointed layer's recomputation) attends the
    same pieces, so the last upload of this thread is kept while the pieces match."""
    if not _varlen_serves(query_1HTD):
        return None
    device = query_1HTD.device
    last: _Uploaded | None = getattr(_row_cache, "row", None)
    if (
        last is not None
        and last.device == device
        and (last.source is pieces or last.pieces == tuple(pieces))
    ):
        return last
    plan = varlen_plan(pieces)
    if plan is None:
        return None
    uploaded = _Uploaded(
        tuple(pieces),
        pieces,
        device,
        plan,
        upload(torch.tensor(plan.cu_queries, dtype=torch.int32), device),
        upload(torch.tensor(plan.cu_keys, dtype=torch.int32), device),
        None if plan.key_positions is None else upload(torch.tensor(plan.key_positions), device),
    )
    _row_cache.row = uploaded
    return uploaded


def _varlen_attention(
    query_1HTD: torch.Tensor,
    key_1KTD: torch.Tensor,
    value_1KTD: torch.Tensor,
    uploaded: _Uploaded,
    scaling: float | None,
    gqa: bool,
) -> torch.Tensor:
    """The row's attention in one varlen call (see the module's docstring); [1, T, H, D]."""
    kernel = _varlen_kernel()
    assert kernel is not None, "checked by _varlen_serves"
    varlen_attn, causal, takes_groups = kernel
    # [1, H, T, D] views of [1, T, H, D] projections: [T, H, D] without a copy.
    query_THD = query_1HTD[0].transpose(0, 1)
    key_TKD, value_TKD = key_1KTD[0].transpose(0, 1), value_1KTD[0].transpose(0, 1)
    if uploaded.key_positions is not None:
        key_TKD = key_TKD.index_select(0, uploaded.key_positions)
        value_TKD = value_TKD.index_select(0, uploaded.key_positions)
    options = dict(causal)
    if gqa and takes_groups:
        options["enable_gqa"] = True
    elif gqa:
        repeat = query_THD.shape[1] // key_TKD.shape[1]
        key_TKD = key_TKD.repeat_interleave(repeat, dim=1)
        value_TKD = value_TKD.repeat_interleave(repeat, dim=1)
    plan = uploaded.plan
    out_THD = varlen_attn(
        query_THD,
        key_TKD,
        value_TKD,
        uploaded.cu_queries,
        uploaded.cu_keys,
        plan.max_queries,
        plan.max_keys,
        scale=scaling,
        **options,
    )
    return out_THD[None]


def register_segment_attention() -> None:
    """Make `SEGMENT_ATTENTION` a name transformers accepts (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(SEGMENT_ATTENTION, segment_attention)


def exclude_from_compilation() -> None:
    """Register the attention so that `torch.compile` leaves it out of compiled graphs
    (it runs eagerly between them): its loop follows the row's sequence boundaries,
    which differ from step to step and would recompile a compiled layer each time."""
    from transformers import AttentionInterface

    AttentionInterface.register(SEGMENT_ATTENTION, torch.compiler.disable(segment_attention))
