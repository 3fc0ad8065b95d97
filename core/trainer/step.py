"""The GRPO step, written once for the single-process trainer and the torchrun ranks.

Flow of `grpo_step`: group advantages (zero-variance groups dropped and counted) →
exact-token sequences (`collect_sequences`) → `mini_batches` interleaved slices → for
each mini-batch: the loss normaliser of the whole mini-batch, the packed rows this
process runs, forward/backward every row (gradients accumulate; the rows' loss sums
and mismatch stay on the device), clip, read the sums once, one AdamW step → stats. The
loss of every row is divided by the normaliser of its whole mini-batch, so how the rows
are packed, micro-batched or spread over ranks changes memory, not the
result (up to rounding).

A trainer hands the step what differs between one process and several (`StepParts`):

- `rows(part, config)`: the packed rows this process runs for a mini-batch. One process
  runs all of them. A rank runs its share (dealt by token count) plus padding rows, two
  tokens with nothing sampled (zero loss, zero gradient), up to the most any rank has:
  FSDP hangs unless every rank runs as many forward and backward passes as the others.
- `sum_over_ranks(values)`: the mini-batch's sums (loss, clipped tokens, KL, ratio, the
  mismatch's sums) over all processes: the values themselves in one process, an
  all-reduce across ranks; `max_over_ranks(values)` likewise for the largest mismatch.
  (Gradients need no hook: FSDP sums them across ranks itself, see ranks.py.)
- `row_logprobs(row, use_adapter)`: one row's token log-probs under the trainer's
  autocast (hardware.py), through FSDP's root module in a rank.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Protocol

import torch
from torch.profiler import record_function

from rlcoach.config import TrainConfig
from rlcoach.runtime.failpoints import poison
from rlcoach.runtime.hardware import upload
from rlcoach.trainer.base import StepStats
from rlcoach.trainer.checkpoint import is_sharded
from rlcoach.trainer.objective import (
    LossTerms,
    MismatchTerms,
    group_advantages,
    loss_normalizer,
    mismatch_metrics,
    policy_loss,
)
from rlcoach.trainer.sequences import PackedRow, TrainSequence, build_sequences
from rlcoach.trajectory.trajectories import TrajectoryGroup

__all__ = [
    "StepParts",
    "collect_sequences",
    "finite_update",
    "grpo_step",
    "row_loss_terms",
    "untrained_stats",
]

logger = logging.getLogger(__name__)


class StepParts(Protocol):
    """What `grpo_step` needs from a trainer (module docstring: the two hooks)."""

    device: torch.device
    model: Any
    """The peft model; its trainable parameters are the LoRA weights."""

    @property
    def optimizer(self) -> torch.optim.Optimizer: ...

    def row_logprobs(self, row: PackedRow, use_adapter: bool = True) -> torch.Tensor:
        """Token log-probs of `row`, shape [T-1] (fp32)."""

    def rows(self, part: list[TrainSequence], config: TrainConfig) -> list[PackedRow]:
        """The packed rows of mini-batch `part` that this process runs."""

    def sum_over_ranks(self, values: list[float]) -> list[float]:
        """`values` summed over every process taking part in the step."""

    def max_over_ranks(self, values: list[float]) -> list[float]:
        """The largest of each of `values` over every process taking part in the step."""


def collect_sequences(
    groups: list[TrajectoryGroup], config: TrainConfig
) -> tuple[list[TrainSequence], int, int]:
    """The training sequences of `groups`, the groups skipped for having no reward
    variance (and no teacher signal), and the trajectories trained on.

    A token's advantage is `reward_coef` x its group's advantage, plus the teacher's
    per-token term where a teacher scored it (objective.py `teacher_advantages`)."""
    sequences: list[TrainSequence] = []
    skipped = 0
    trajectories = 0
    for group in groups:
        if not group.trajectories:
            continue
        rewards_G = torch.tensor(group.rewards, dtype=torch.float32)
        advantages_G = config.reward_coef * group_advantages(rewards_G, config.scale_rewards)
        # Sequences are built even for skipped groups: bad data fails loudly either way.
        built = [
            build_sequences(t, float(a), teacher_coef=config.teacher_coef)
            for t, a in zip(group.trajectories, advantages_G, strict=True)
        ]
        taught = any(abs(a) >= 1e-8 for per in built for s in per for a in s.token_advantages)
        if torch.all(advantages_G.abs() < 1e-8) and not taught:
            skipped += 1
            continue
        trajectories += len(group.trajectories)
        sequences += [s for per_trajectory in built for s in per_trajectory]
    return sequences, skipped, trajectories


def untrained_stats(
    groups: int, skipped: int, started: float, non_finite: int = 0, optimizer_steps: int = 0
) -> StepStats:
    """The stats of a step that trained nothing: no group had reward variance, or the
    loss or gradient norm of mini-batch `non_finite` was not finite (after
    `optimizer_steps` updates of the mini-batches before it)."""
    return StepStats(
        non_finite=non_finite,
        optimizer_steps=optimizer_steps,
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
    parts: StepParts,
    row: PackedRow,
    normalizer: float,
    config: TrainConfig,
    trainer_old_T: torch.Tensor | None = None,
) -> LossTerms:
    """The policy loss of one packed row under `parts.row_logprobs` (and its reference
    pass, the adapter disabled, when the KL term is on). `trainer_old_T`: the trainer's
    log-probs of the row at the sampling weights, when they are not the current ones."""
    device = parts.device
    ref = parts.row_logprobs(row, use_adapter=False) if config.kl_coef > 0 else None
    new_T = parts.row_logprobs(row)
    # upload: a blocking host-to-device copy waits for the GPU to finish everything queued
    # (cudaStreamSynchronize), leaving it idle at each row's start.
    return policy_loss(
        new_T,
        upload(row.old_logprobs_T[1:], device),
        upload(row.advantages_T[1:], device),
        upload(row.sampled_mask_T[1:], device),
        normalizer=normalizer,
        kind=config.loss,
        clip_low=config.clip_low,
        clip_high=config.clip_high,
        ref_logprobs_T=ref,
        kl_coef=config.kl_coef,
        tis_cap=config.tis_cap,
        trainer_old_logprobs_T=trainer_old_T,
        mismatch_threshold=config.mismatch_threshold,
    )


def finite_update(
    optimizer: torch.optim.Optimizer, loss: float, grad_norm: float, number: int
) -> bool:
    """The optimizer update of mini-batch `number` (1, 2, ...), only if its loss and
    gradient norm are finite; else its gradients are dropped and False says the whole
    step is skipped. The one check of RL steps and SFT runs alike: a skipped step is
    never saved or published, and the backend makes a trainer that an earlier
    mini-batch had updated again from the latest checkpoint."""
    if math.isfinite(loss) and math.isfinite(grad_norm):
        optimizer.step()
        return True
    optimizer.zero_grad(set_to_none=True)
    logger.warning(
        "mini-batch %d: loss %s, gradient norm %s; the step is skipped (no update from "
        "this mini-batch; nothing is saved or published)",
        number,
        loss,
        grad_norm,
    )
    return False


def _as_float(norm: torch.Tensor) -> float:
    """A gradient norm as a number (under FSDP a DTensor: its value is a collective)."""
    return float(norm.full_tensor() if is_sharded(norm) else norm)  # type: ignore[attr-defined]  # a DTensor


def _trainer_old_logprobs(
    parts: StepParts, rows_by_part: list[list[PackedRow]]
) -> list[list[torch.Tensor | None]]:
    """The trainer's log-probs of every row of every mini-batch after the first, at the
    sampling weights (before any optimizer step): what TIS weighs against and the
    mismatch is measured on when the weights have moved (mini_batches > 1)."""
    olds: list[list[torch.Tensor | None]] = [[None] * len(rows_by_part[0])]
    with torch.no_grad():
        for rows in rows_by_part[1:]:
            olds.append([parts.row_logprobs(row).detach() for row in rows])
    return olds


def _any_unknown(sequences: list[TrainSequence]) -> bool:
    """Whether a trained token has no sampler log-prob (NaN: objective.py)."""
    return any(
        lp != lp and m
        for s in sequences
        for lp, m in zip(s.old_logprobs, s.sampled_mask, strict=True)
    )


def _backward_rows(
    parts: StepParts,
    rows: list[PackedRow],
    olds: list[torch.Tensor | None],
    normalizer: float,
    c: TrainConfig,
    number: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Forward and backward of one mini-batch's rows: their sums [4] (loss, clipped
    tokens, KL, ratio) and the mismatch terms [5] where measured. The sums stay on the
    device and are read once per mini-batch with the gradient norm: a read per row would
    make the CPU wait for the GPU between rows, leaving it idle while the next row's
    kernels are launched."""
    sums_4 = torch.zeros(4, device=parts.device)
    measured_5: torch.Tensor | None = None
    for row, old in zip(rows, olds, strict=True):
        with record_function("rlcoach.forward"):
            terms = row_loss_terms(parts, row, normalizer, c, old)
        with record_function("rlcoach.backward"):
            terms.loss.backward()
        sums_4 += torch.stack(
            [terms.loss.detach(), terms.clipped_tokens, terms.kl_sum, terms.ratio_sum]
        ).float()
        if number == 0 or old is not None:
            measured_5 = _combine(measured_5, terms.mismatch_5)
    return sums_4, measured_5


def grpo_step(parts: StepParts, groups: list[TrajectoryGroup], c: TrainConfig) -> StepStats:
    """One RL step on `groups`; stats with `trained=False` when no group had variance.

    The sampler/trainer mismatch is measured on the tokens trained at the sampling
    weights: all of them with one mini-batch or with TIS (whose extra no-grad pass gives
    the later mini-batches' trainer log-probs at those weights), else the first
    mini-batch's."""
    for group in parts.optimizer.param_groups:
        group["lr"] = c.learning_rate
    started = time.perf_counter()
    with record_function("rlcoach.sequences"):
        sequences, skipped, trajectories = collect_sequences(groups, c)
    if not sequences:
        return untrained_stats(len(groups), skipped, started)
    params = [p for p in parts.model.parameters() if p.requires_grad]
    mini_batches = [sequences[i :: c.mini_batches] for i in range(c.mini_batches)]
    mini_batches = [p for p in mini_batches if p]
    losses, norms = [], []
    clipped = kl = ratio = 0.0
    mismatch: list[MismatchTerms] = []
    parts.model.train()
    try:
        with record_function("rlcoach.pack_rows"):
            rows_by_part = [parts.rows(part, c) for part in mini_batches]
        olds: list[list[torch.Tensor | None]] = [[None] * len(rows) for rows in rows_by_part]
        if len(mini_batches) > 1 and (c.tis_cap is not None or _any_unknown(sequences)):
            # Only here: with one mini-batch, or without TIS and with every sampler
            # log-prob known, the sampler's log-probs are the old ones and no pass
            # recomputes them (objective.py). An unknown one (NaN) is the trainer's own at
            # the sampling weights, which a later mini-batch no longer has.
            with record_function("rlcoach.old_logprobs"):
                olds = _trainer_old_logprobs(parts, rows_by_part)
        for number, (part, rows) in enumerate(zip(mini_batches, rows_by_part, strict=True)):
            normalizer = loss_normalizer(c.loss, [s.sampled_tokens for s in part])
            parts.optimizer.zero_grad(set_to_none=True)
            sums_4, measured_5 = _backward_rows(parts, rows, olds[number], normalizer, c, number)
            with record_function("rlcoach.clip_and_read"):
                norm = _as_float(torch.nn.utils.clip_grad_norm_(params, c.max_grad_norm))
                sums = [float(x) for x in sums_4.tolist()]
                if measured_5 is not None:
                    mismatch.append(MismatchTerms.from_sums(measured_5))
            # Summed over ranks before the update, so every rank sees the same values
            # (the norm is global under FSDP) and all of them stop here together (a fault
            # test's NaN, failpoints.py, is added before the sum for the same reason).
            sums[0] = poison("update.loss", sums[0])
            part_loss, part_clipped, part_kl, part_ratio = parts.sum_over_ranks(sums)
            with record_function("rlcoach.optimizer"):
                updated = finite_update(parts.optimizer, part_loss, norm, number + 1)
            if not updated:
                return untrained_stats(
                    len(groups), skipped, started, non_finite=number + 1, optimizer_steps=number
                )
            norms.append(norm)
            losses.append(part_loss)
            clipped, kl, ratio = clipped + part_clipped, kl + part_kl, ratio + part_ratio
        measured = _over_ranks(parts, mismatch)
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
        optimizer_steps=len(norms),
        **mismatch_metrics([measured]),  # type: ignore[arg-type]  # its fields are all floats
    )


def _combine(total_5: torch.Tensor | None, row_5: torch.Tensor) -> torch.Tensor:
    """Two rows' `mismatch_sums` as one: sums add, abs_max (index 2) is the larger."""
    if total_5 is None:
        return row_5
    combined_5 = total_5 + row_5
    combined_5[2] = torch.maximum(total_5[2], row_5[2])
    return combined_5


def _over_ranks(parts: StepParts, terms: list[MismatchTerms]) -> MismatchTerms:
    """This process's mismatch terms combined with every other process's."""
    tokens, abs_sum, k3_sum, beyond = parts.sum_over_ranks(
        [
            sum(t.tokens for t in terms),
            sum(t.abs_sum for t in terms),
            sum(t.k3_sum for t in terms),
            sum(t.beyond for t in terms),
        ]
    )
    [abs_max] = parts.max_over_ranks([max((t.abs_max for t in terms), default=0.0)])
    return MismatchTerms(tokens, abs_sum, abs_max, k3_sum, beyond)
