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
call: the sequence start offsets followed by the row length, as a tuple or as a CPU
int64 tensor. The trainer passes the tensor: a compiled decoder layer (fusion.py) guards
on a tuple's length and values, so every new set of boundaries would recompile it, while
a tensor is a graph input whose values the guards ignore.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.nn.functional as F

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


def segment_attention(
    module: torch.nn.Module,
    query_1HTD: torch.Tensor,
    key_1KTD: torch.Tensor,
    value_1KTD: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    rlcoach_segments: tuple[int, ...] | torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal attention within each sequence of a packed row; output [1, T, H, D]."""
    if attention_mask is not None:
        raise ValueError(
            f"{SEGMENT_ATTENTION!r} attention got an attention mask; it takes the sequence "
            "boundaries (`rlcoach_segments=`) instead — fix: pass attention_mask=None"
        )
    length = query_1HTD.shape[2]
    bounds = rlcoach_segments if rlcoach_segments is not None else (0, length)
    if isinstance(bounds, torch.Tensor):  # a CPU tensor: reading it does not sync the GPU
        bounds = tuple(bounds.tolist())
    if bounds[-1] != length:
        raise ValueError(
            f"sequence boundaries {bounds[:4]}...{bounds[-1]} do not end at the row length "
            f"{length}; fix: build them with segment_bounds(position_ids) of the same row"
        )
    gqa = query_1HTD.shape[1] != key_1KTD.shape[1]
    pieces = []
    for start, end in itertools.pairwise(bounds):
        pieces.append(
            F.scaled_dot_product_attention(
                query_1HTD[:, :, start:end],
                key_1KTD[:, :, start:end],
                value_1KTD[:, :, start:end],
                is_causal=True,
                scale=scaling,
                dropout_p=dropout if module.training else 0.0,
                enable_gqa=gqa,
            )
        )
    out_1HTD = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=2)
    return out_1HTD.transpose(1, 2).contiguous(), None


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
