"""The GRPO objective: group-relative advantages and a token-level PPO-clip loss.

Pure tensor functions, no model, no state. Every choice, and where it departs from the
GRPO paper (Shao et al., 2024):

Advantages (`group_advantages`)
- A trajectory's advantage is its reward minus the mean reward of its group; every
  token it sampled gets that advantage.
- Dividing by the group's reward std (the paper) is optional and off by default
  (`scale_rewards=False`), following Dr.GRPO (Liu et al., 2025): the std makes groups
  with nearly equal rewards count as much as groups with real differences.
- A group whose rewards are all equal has zero advantages and teaches nothing; the
  trainer drops it and reports how many were dropped rather than counting it as training.

Per-token advantages from a teacher (`teacher_advantages`, on-policy distillation)
- Where a teacher scored the sampled tokens (`SampledChoice.teacher_logprobs`), each
  token's advantage is `reward_coef * A_group + teacher_coef * (log pi_teacher(x) -
  log pi_sampler(x))`: the negative of the per-token reverse KL, `log pi_student -
  log pi_teacher`, estimated on the student's own sample (Agarwal et al., 2024, "On-Policy
  Distillation of Language Models"; Thinking Machines' "On-Policy Distillation", 2025).
  Signs: a token the teacher finds likelier than the student gets a positive advantage
  (the student is pushed towards it), one the teacher finds less likely a negative one;
  a teacher equal to the student gives 0 everywhere, and a step of such groups trains
  nothing (it is skipped as having no variance). The sampler's log-probs stand for the
  student: the same weights, recorded when the token was drawn.
- The advantage is per token and undiscounted (no sum over later tokens), as in the
  references: each token's term is its own reverse-KL estimate.
- A token without a sampler log-prob (NaN, a client-built reply) gets no teacher term.

Loss (`policy_loss`)
- Behaviour policy = the engine's logprobs recorded at sampling time (not a re-run of the
  old weights), so the ratio also corrects for small engine/trainer numeric differences
  and for samples taken by an older adapter.
- `grpo`: the PPO clipped surrogate per token, `-min(r*A, clip(r, 1-eps_low, 1+eps_high)*A)`
  with asymmetric clipping (eps_high > eps_low, "clip-higher" from DAPO, Yu et al., 2025),
  averaged over all sampled tokens of the batch (token-level, also DAPO), not per
  sequence first as in the paper — long answers are not down-weighted per token.
- `dr_grpo`: the same surrogate summed and divided by a constant, sequences x the longest
  sampled length in the batch (Dr.GRPO), which removes the length bias of per-sequence
  means without making the step size depend on the batch's token count.
- `cispo`: `-sg(min(r, 1+eps_high)) * A * log pi` (MiniMax-M1): clips the importance
  weight, not the update, so every token keeps a gradient.
- Behaviour log-probs missing (NaN: client-built replies without sampler log-probs,
  trainer/render.py; constrained replies the policy endpoint left to the trainer,
  endpoint/rescore.py) are the trainer's own at the sampling weights, detached (ratio 1
  on the first optimizer step; a later mini-batch gets them from a no-grad pass before
  the first, step.py), as ART does; they are replaced before the mismatch is measured
  and left out of it.
- KL: off by default (`kl_coef=0`, as in DAPO and Dr.GRPO). When on, the k3 estimator
  `exp(ref-new) - (ref-new) - 1` against the base model (adapter disabled) is added per
  token, inside the same normalisation, instead of into the reward.
- Forced tokens (a sampling constraint left exactly one allowed token) are not in the
  mask: the policy did not choose them (see sequences.py and docs/capture.md).

Sampler/trainer mismatch (`mismatch_sums`, `sampler_mismatch`)
- vLLM and the trainer compute the same weights' log-probs with different kernels, so
  they disagree a little even on-policy. Each step measures it on the trained tokens at
  the weights that sampled them: mean and max |trainer - sampler| log-prob, the k3
  estimate of KL(sampler || trainer) (`exp(t-s) - (t-s) - 1`, unbiased for tokens drawn
  from the sampler) and the share of tokens whose |difference| exceeds a threshold.

Truncated importance sampling (`truncated_importance_weights`, `tis_cap`)
- Off by default. On, it follows Yao et al., 2025 ("Your Efficient RL Framework Secretly
  Brings You Off-Policy RL Training"): the PPO ratio is taken against the trainer's own
  log-probs at the sampling weights (`trainer_old_logprobs_T`), and each token's loss is
  multiplied by `min(pi_trainer / pi_sampler, cap)` (detached), which corrects for the
  sampler being a slightly different distribution without letting a rare token whose
  sampler probability is tiny blow the step up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

__all__ = [
    "LossTerms",
    "MismatchTerms",
    "group_advantages",
    "loss_normalizer",
    "mismatch_metrics",
    "mismatch_sums",
    "policy_loss",
    "sampler_mismatch",
    "teacher_advantages",
    "truncated_importance_weights",
]

LossKind = Literal["grpo", "dr_grpo", "cispo"]


def group_advantages(
    rewards_G: torch.Tensor, scale_rewards: bool = False, eps: float = 1e-6
) -> torch.Tensor:
    """Advantages for the G trajectories of one group (float tensor of shape [G])."""
    centered_G = rewards_G - rewards_G.mean()
    if scale_rewards:
        centered_G = centered_G / (rewards_G.std(unbiased=False) + eps)
    return centered_G


def teacher_advantages(
    teacher_logprobs_T: torch.Tensor, student_logprobs_T: torch.Tensor, coef: float = 1.0
) -> torch.Tensor:
    """`coef * (teacher - student)` per sampled token: minus the reverse KL's per-token
    estimate, so tokens the teacher prefers get a positive advantage. 0 where either
    log-prob is unknown (NaN)."""
    delta_T = coef * (teacher_logprobs_T - student_logprobs_T)
    return torch.where(torch.isnan(delta_T), torch.zeros_like(delta_T), delta_T)


def loss_normalizer(kind: LossKind, sampled_tokens_S: list[int]) -> float:
    """What the summed per-token loss of a whole batch (S sequences) is divided by."""
    if not sampled_tokens_S or sum(sampled_tokens_S) == 0:
        return 1.0
    if kind == "dr_grpo":
        return float(len(sampled_tokens_S) * max(sampled_tokens_S))
    return float(sum(sampled_tokens_S))


@dataclass(frozen=True, slots=True)
class MismatchTerms:
    """How far the trainer's log-probs are from the sampler's on one micro-batch's trained
    tokens (sums and a max, so micro-batches and ranks combine exactly)."""

    tokens: float
    abs_sum: float
    abs_max: float
    k3_sum: float
    beyond: float
    """Tokens whose |trainer - sampler| log-prob exceeds the threshold."""

    @classmethod
    def from_sums(cls, sums_5: torch.Tensor) -> MismatchTerms:
        """From `mismatch_sums`' [tokens, abs_sum, abs_max, k3_sum, beyond] (one wait
        for the device)."""
        tokens, abs_sum, abs_max, k3_sum, beyond = (float(x) for x in sums_5.tolist())
        return cls(tokens, abs_sum, abs_max, k3_sum, beyond)


@dataclass(frozen=True, slots=True)
class LossTerms:
    """The loss of one micro-batch (already divided by the batch normalizer) and stats."""

    loss: torch.Tensor
    clipped_tokens: torch.Tensor
    kl_sum: torch.Tensor
    ratio_sum: torch.Tensor
    mismatch_5: torch.Tensor
    """The sampler/trainer mismatch on these tokens as `mismatch_sums` gives it, still
    on the device (meaningful before the first optimizer step on the batch, when the
    trainer's weights are the sampling ones)."""

    @property
    def mismatch(self) -> MismatchTerms:
        """`mismatch_5` as numbers (waits for the device: the step sums rows first)."""
        return MismatchTerms.from_sums(self.mismatch_5)


def truncated_importance_weights(
    trainer_logprobs_T: torch.Tensor, sampler_logprobs_T: torch.Tensor, cap: float
) -> torch.Tensor:
    """`min(pi_trainer / pi_sampler, cap)` per token, detached (Yao et al., 2025).

    Both log-probs are of the same sampled tokens at the weights that sampled them: the
    trainer's recomputation and the engine's report. A weight above 1 means the trainer
    finds the token likelier than the sampler did; the cap bounds the variance."""
    log_weight_T = (trainer_logprobs_T - sampler_logprobs_T).detach()
    return torch.clamp(torch.exp(log_weight_T), max=cap)


def policy_loss(
    new_logprobs_T: torch.Tensor,
    old_logprobs_T: torch.Tensor,
    advantages_T: torch.Tensor,
    mask_T: torch.Tensor,
    *,
    normalizer: float,
    kind: LossKind = "grpo",
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    ref_logprobs_T: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    tis_cap: float | None = None,
    trainer_old_logprobs_T: torch.Tensor | None = None,
    mismatch_threshold: float = 0.2,
) -> LossTerms:
    """Token-level loss over T tokens; `mask_T` is 1 on trained tokens, 0 elsewhere.

    `old_logprobs_T` are the sampler's (the engine's) log-probs. With `tis_cap`, the
    ratio is taken against `trainer_old_logprobs_T` (the trainer's log-probs at the
    sampling weights; default: `new_logprobs_T` detached, right for the first optimizer
    step on a batch) and each token is weighted by `truncated_importance_weights`.

    A NaN sampler log-prob (none recorded: a client-built reply, a constrained one) is
    replaced by the trainer's own at the sampling weights, detached, before anything
    else: that token's ratio starts at 1, its TIS weight is 1, and it is left out of the
    mismatch statistics (there is no sampler value to compare with)."""
    mask_T = mask_T.to(new_logprobs_T.dtype)
    # The mismatch is of the weights that sampled: trainer_old when given, else new.
    trainer_at_sampling_T = (
        new_logprobs_T if trainer_old_logprobs_T is None else trainer_old_logprobs_T
    )
    # No branch on the NaNs' presence: that would wait for the device on every row.
    unknown_T = torch.isnan(old_logprobs_T)
    old_logprobs_T = torch.where(unknown_T, trainer_at_sampling_T.detach(), old_logprobs_T)
    measured_T = mask_T * (~unknown_T).to(mask_T.dtype)
    mismatch_5 = mismatch_sums(
        trainer_at_sampling_T, old_logprobs_T, measured_T, mismatch_threshold
    )
    tis_T = torch.ones_like(new_logprobs_T)
    if tis_cap is not None:
        trainer_old_T = (
            new_logprobs_T.detach() if trainer_old_logprobs_T is None else trainer_old_logprobs_T
        )
        tis_T = truncated_importance_weights(trainer_old_T, old_logprobs_T, tis_cap)
        old_logprobs_T = trainer_old_T
    log_ratio_T = (new_logprobs_T - old_logprobs_T) * mask_T
    ratio_T = torch.exp(log_ratio_T)
    if kind == "cispo":
        weight_T = torch.clamp(ratio_T, max=1.0 + clip_high).detach()
        per_token_T = -weight_T * advantages_T * new_logprobs_T
        clipped_T = (ratio_T > 1.0 + clip_high).to(mask_T.dtype)
    else:
        unclipped_T = ratio_T * advantages_T
        clipped_ratio_T = torch.clamp(ratio_T, 1.0 - clip_low, 1.0 + clip_high)
        per_token_T = -torch.minimum(unclipped_T, clipped_ratio_T * advantages_T)
        clipped_T = (clipped_ratio_T * advantages_T < unclipped_T).to(mask_T.dtype)
    per_token_T = tis_T * per_token_T
    kl_T = torch.zeros_like(per_token_T)
    if ref_logprobs_T is not None and kl_coef > 0.0:
        delta_T = (ref_logprobs_T - new_logprobs_T) * mask_T
        kl_T = torch.exp(delta_T) - delta_T - 1.0
        per_token_T = per_token_T + kl_coef * kl_T
    loss = (per_token_T * mask_T).sum() / normalizer
    return LossTerms(
        loss=loss,
        clipped_tokens=(clipped_T * mask_T).sum().detach(),
        kl_sum=(kl_T * mask_T).sum().detach(),
        ratio_sum=(ratio_T * mask_T).sum().detach(),
        mismatch_5=mismatch_5,
    )


def mismatch_sums(
    trainer_logprobs_T: torch.Tensor,
    sampler_logprobs_T: torch.Tensor,
    mask_T: torch.Tensor,
    threshold: float,
) -> torch.Tensor:
    """Sampler/trainer disagreement on the tokens where `mask_T` is 1 (no gradient), as
    one device tensor [tokens, abs_sum, abs_max, k3_sum, beyond]: masked sums rather
    than a boolean selection, so nothing waits for the device (a selection's size is a
    device value). Rows combine by adding, except abs_max (the largest)."""
    with torch.no_grad():
        keep_T = mask_T.bool()
        delta_T = torch.where(keep_T, trainer_logprobs_T.float() - sampler_logprobs_T.float(), 0.0)
        abs_T = delta_T.abs()
        k3_T = torch.exp(delta_T) - delta_T - 1.0  # 0 where not kept (delta 0)
        return torch.stack(
            [
                keep_T.sum().float(),
                abs_T.sum(),
                abs_T.max() if abs_T.numel() else abs_T.new_zeros(()),
                k3_T.sum(),
                (keep_T & (abs_T > threshold)).sum().float(),
            ]
        )


def sampler_mismatch(
    trainer_logprobs_T: torch.Tensor,
    sampler_logprobs_T: torch.Tensor,
    mask_T: torch.Tensor,
    threshold: float,
) -> MismatchTerms:
    """Sampler/trainer disagreement on the tokens where `mask_T` is 1, as numbers."""
    return MismatchTerms.from_sums(
        mismatch_sums(trainer_logprobs_T, sampler_logprobs_T, mask_T, threshold)
    )


def mismatch_metrics(terms: list[MismatchTerms]) -> dict[str, float]:
    """A step's mismatch metrics from its micro-batches' terms (zeros when none)."""
    tokens = sum(t.tokens for t in terms)
    if tokens == 0:
        return {
            "mismatch_abs_mean": 0.0,
            "mismatch_abs_max": 0.0,
            "mismatch_kl_k3": 0.0,
            "mismatch_beyond_fraction": 0.0,
        }
    return {
        "mismatch_abs_mean": sum(t.abs_sum for t in terms) / tokens,
        "mismatch_abs_max": max(t.abs_max for t in terms),
        "mismatch_kl_k3": sum(t.k3_sum for t in terms) / tokens,
        "mismatch_beyond_fraction": sum(t.beyond for t in terms) / tokens,
    }
