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
  trainer/render.py) are the current policy's own, detached (ratio 1), as ART does.
- KL: off by default (`kl_coef=0`, as in DAPO and Dr.GRPO). When on, the k3 estimator
  `exp(ref-new) - (ref-new) - 1` against the base model (adapter disabled) is added per
  token, inside the same normalisation, instead of into the reward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

__all__ = ["LossTerms", "group_advantages", "loss_normalizer", "policy_loss"]

LossKind = Literal["grpo", "dr_grpo", "cispo"]


def group_advantages(
    rewards_G: torch.Tensor, scale_rewards: bool = False, eps: float = 1e-6
) -> torch.Tensor:
    """Advantages for the G trajectories of one group (float tensor of shape [G])."""
    centered_G = rewards_G - rewards_G.mean()
    if scale_rewards:
        centered_G = centered_G / (rewards_G.std(unbiased=False) + eps)
    return centered_G


def loss_normalizer(kind: LossKind, sampled_tokens_S: list[int]) -> float:
    """What the summed per-token loss of a whole batch (S sequences) is divided by."""
    if not sampled_tokens_S or sum(sampled_tokens_S) == 0:
        return 1.0
    if kind == "dr_grpo":
        return float(len(sampled_tokens_S) * max(sampled_tokens_S))
    return float(sum(sampled_tokens_S))


@dataclass(frozen=True, slots=True)
class LossTerms:
    """The loss of one micro-batch (already divided by the batch normalizer) and stats."""

    loss: torch.Tensor
    clipped_tokens: torch.Tensor
    kl_sum: torch.Tensor
    ratio_sum: torch.Tensor


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
) -> LossTerms:
    """Token-level loss over T tokens; `mask_T` is 1 on sampled tokens, 0 on context.

    A NaN behaviour log-prob (a client-built reply without one, trainer/render.py) is
    the current policy's own, detached: that token's ratio is 1."""
    mask_T = mask_T.to(new_logprobs_T.dtype)
    old_logprobs_T = torch.where(
        torch.isnan(old_logprobs_T), new_logprobs_T.detach(), old_logprobs_T
    )
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
    )
