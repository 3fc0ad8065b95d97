"""The GRPO step, written once for the single-process trainer and the torchrun ranks.

Flow of `grpo_step`: group advantages (zero-variance groups dropped and counted) →
exact-token sequences (`collect_sequences`) → `mini_batches` interleaved slices → for
each mini-batch: the loss normaliser of the whole mini-batch, the packed rows this
process runs, forward/backward every row (gradients accumulate), clip, one AdamW step →
stats. The loss of every row is divided by the normaliser of its whole mini-batch, so
how the rows are packed, micro-batched or spread over ranks changes memory, not the
result (up to rounding).

A trainer hands the step what differs between one process and several (`StepParts`):

- `rows(part, config)`: the packed rows this process runs for a mini-batch. One process
  runs all of them. A rank runs its share (dealt by token count) plus padding rows, two
  tokens with nothing sampled (zero loss, zero gradient), up to the most any rank has:
  FSDP hangs unless every rank runs as many forward and backward passes as the others.
- `sum_over_ranks(values)`: the mini-batch's sums (loss, clipped tokens, KL, ratio)
  over all processes: the values themselves in one process, an all-reduce across ranks.
  (Gradients need no hook: FSDP sums them across ranks itself, see ranks.py.)
- `row_logprobs(row, use_adapter)`: one row's token log-probs under the trainer's
  autocast (hardware.py), through FSDP's root module in a rank.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import torch

from rlcoach.config import TrainConfig
from rlcoach.trainer.base import StepStats
from rlcoach.trainer.checkpoint import is_sharded
from rlcoach.trainer.objective import LossTerms, group_advantages, loss_normalizer, policy_loss
from rlcoach.trainer.sequences import PackedRow, TrainSequence, build_sequences
from rlcoach.types import TrajectoryGroup

__all__ = [
    "StepParts",
    "collect_sequences",
    "grpo_step",
    "row_loss_terms",
    "untrained_stats",
]


class StepParts(Protocol):
    """What `grpo_step` needs from a trainer (module docstring: the two hooks)."""

    device: torch.device
    model: Any
    """The peft model; its trainable parameters are the LoRA weights."""
    optimizer: torch.optim.Optimizer

    def row_logprobs(self, row: PackedRow, use_adapter: bool = True) -> torch.Tensor:
        """Token log-probs of `row`, shape [T-1] (fp32)."""

    def rows(self, part: list[TrainSequence], config: TrainConfig) -> list[PackedRow]:
        """The packed rows of mini-batch `part` that this process runs."""

    def sum_over_ranks(self, values: list[float]) -> list[float]:
        """`values` summed over every process taking part in the step."""


def collect_sequences(
    groups: list[TrajectoryGroup], config: TrainConfig
) -> tuple[list[TrainSequence], int, int]:
    """The training sequences of `groups`, the groups skipped for having no reward
    variance, and the trajectories trained on."""
    sequences: list[TrainSequence] = []
    skipped = 0
    trajectories = 0
    for group in groups:
        if not group.trajectories:
            continue
        rewards_G = torch.tensor(group.rewards, dtype=torch.float32)
        advantages_G = group_advantages(rewards_G, config.scale_rewards)
        # Sequences are built even for skipped groups: bad data fails loudly either way.
        built = [
            build_sequences(t, float(a))
            for t, a in zip(group.trajectories, advantages_G, strict=True)
        ]
        if torch.all(advantages_G.abs() < 1e-8):
            skipped += 1
            continue
        trajectories += len(group.trajectories)
        sequences += [s for per_trajectory in built for s in per_trajectory]
    return sequences, skipped, trajectories


def untrained_stats(groups: int, skipped: int, started: float) -> StepStats:
    """The stats of a step that trained nothing: no group had reward variance."""
    return StepStats(
        trained=False,
        groups=groups,
        groups_skipped_no_variance=skipped,
        trajectories=0,
        sequences=0,
        sampled_tokens=0,
        total_tokens=0,
        loss=0.0,
        grad_norm=0.0,
        clip_fraction=0.0,
        kl=0.0,
        mean_ratio=1.0,
        seconds=time.perf_counter() - started,
    )


def row_loss_terms(
    parts: StepParts, row: PackedRow, normalizer: float, config: TrainConfig
) -> LossTerms:
    """The policy loss of one packed row under `parts.row_logprobs` (and its reference
    pass, the adapter disabled, when the KL term is on)."""
    device = parts.device
    ref = parts.row_logprobs(row, use_adapter=False) if config.kl_coef > 0 else None
    new_T = parts.row_logprobs(row)
    return policy_loss(
        new_T,
        row.old_logprobs_T[1:].to(device),
        row.advantages_T[1:].to(device),
        row.sampled_mask_T[1:].to(device),
        normalizer=normalizer,
        kind=config.loss,
        clip_low=config.clip_low,
        clip_high=config.clip_high,
        ref_logprobs_T=ref,
        kl_coef=config.kl_coef,
    )


def _as_float(norm: torch.Tensor) -> float:
    """A gradient norm as a number (under FSDP a DTensor: its value is a collective)."""
    return float(norm.full_tensor() if is_sharded(norm) else norm)


def grpo_step(parts: StepParts, groups: list[TrajectoryGroup], c: TrainConfig) -> StepStats:
    """One RL step on `groups`; stats with `trained=False` when no group had variance."""
    for group in parts.optimizer.param_groups:
        group["lr"] = c.learning_rate
    started = time.perf_counter()
    sequences, skipped, trajectories = collect_sequences(groups, c)
    if not sequences:
        return untrained_stats(len(groups), skipped, started)
    params = [p for p in parts.model.parameters() if p.requires_grad]
    mini_batches = [sequences[i :: c.mini_batches] for i in range(c.mini_batches)]
    losses, norms = [], []
    clipped = kl = ratio = 0.0
    parts.model.train()
    try:
        for part in (p for p in mini_batches if p):
            normalizer = loss_normalizer(c.loss, [s.sampled_tokens for s in part])
            parts.optimizer.zero_grad(set_to_none=True)
            sums = [0.0, 0.0, 0.0, 0.0]  # loss, clipped tokens, KL, ratio
            for row in parts.rows(part, c):
                terms = row_loss_terms(parts, row, normalizer, c)
                terms.loss.backward()
                for index, value in enumerate(
                    (terms.loss, terms.clipped_tokens, terms.kl_sum, terms.ratio_sum)
                ):
                    sums[index] += float(value.detach())
            norms.append(_as_float(torch.nn.utils.clip_grad_norm_(params, c.max_grad_norm)))
            parts.optimizer.step()
            part_loss, part_clipped, part_kl, part_ratio = parts.sum_over_ranks(sums)
            losses.append(part_loss)
            clipped, kl, ratio = clipped + part_clipped, kl + part_kl, ratio + part_ratio
    finally:
        parts.model.eval()
    sampled = sum(s.sampled_tokens for s in sequences)
    return StepStats(
        trained=True,
        groups=len(groups),
        groups_skipped_no_variance=skipped,
        trajectories=trajectories,
        sequences=len(sequences),
        sampled_tokens=sampled,
        total_tokens=sum(len(s.token_ids) for s in sequences),
        loss=sum(losses) / len(losses),
        grad_norm=sum(norms) / len(norms),
        clip_fraction=clipped / sampled,
        kl=kl / sampled,
        mean_ratio=ratio / sampled,
        seconds=time.perf_counter() - started,
    )
