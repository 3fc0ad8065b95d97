"""The GRPO maths against values computed by hand."""

import math

import pytest
import torch

from rlcoach.trainer.objective import group_advantages, loss_normalizer, policy_loss


def test_advantages_are_rewards_minus_group_mean():
    advantages_G = group_advantages(torch.tensor([1.0, 0.0, 0.5, 0.5]))
    assert advantages_G.tolist() == [0.5, -0.5, 0.0, 0.0]


def test_scaled_advantages_divide_by_population_std():
    # mean 0.5, population std 0.5 -> (r - 0.5) / 0.5
    advantages_G = group_advantages(torch.tensor([1.0, 0.0]), scale_rewards=True, eps=0.0)
    assert advantages_G.tolist() == [1.0, -1.0]


def test_equal_rewards_give_zero_advantages_even_when_scaled():
    advantages_G = group_advantages(torch.tensor([0.3, 0.3, 0.3]), scale_rewards=True)
    assert torch.all(advantages_G.abs() < 1e-6)


def test_normalizers():
    assert loss_normalizer("grpo", [3, 5]) == 8.0
    assert loss_normalizer("cispo", [3, 5]) == 8.0
    assert loss_normalizer("dr_grpo", [3, 5]) == 10.0  # 2 sequences x longest 5
    assert loss_normalizer("grpo", []) == 1.0


def test_on_policy_grpo_loss_is_minus_mean_advantage():
    # ratio 1 everywhere: loss = -sum(A * mask) / normalizer; context token (mask 0) ignored
    new_T = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    terms = policy_loss(
        new_T,
        new_T.detach().clone(),
        torch.tensor([2.0, 2.0, 7.0]),
        torch.tensor([1.0, 1.0, 0.0]),
        normalizer=2.0,
    )
    assert terms.loss.item() == pytest.approx(-2.0)
    assert terms.ratio_sum.item() == pytest.approx(2.0)
    terms.loss.backward()
    # d/d new of -(exp(new-old) * A)/2 at ratio 1 is -A/2 on sampled tokens, 0 on context
    assert new_T.grad.tolist() == pytest.approx([-1.0, -1.0, 0.0])


def test_clipping_positive_and_negative_advantages():
    old_T = torch.zeros(2)
    # token 0: ratio e^0.5=1.65 > 1.28 with A=+1 -> clipped to 1.28, no gradient
    # token 1: ratio e^-0.5=0.61 < 0.8 with A=-1 -> clipped to 0.8, no gradient
    new_T = torch.tensor([0.5, -0.5], requires_grad=True)
    terms = policy_loss(
        new_T,
        old_T,
        torch.tensor([1.0, -1.0]),
        torch.ones(2),
        normalizer=2.0,
        clip_low=0.2,
        clip_high=0.28,
    )
    assert terms.loss.item() == pytest.approx((-1.28 + 0.8) / 2)
    assert terms.clipped_tokens.item() == 2
    terms.loss.backward()
    assert new_T.grad.tolist() == [0.0, 0.0]


def test_ratio_outside_the_clip_on_the_losing_side_keeps_its_gradient():
    # A=+1 and ratio 0.5 (<0.8): min(r*A, clip(r)*A) = r*A, the unclipped term, so it trains
    new_T = torch.tensor([math.log(0.5)], requires_grad=True)
    terms = policy_loss(new_T, torch.zeros(1), torch.ones(1), torch.ones(1), normalizer=1.0)
    assert terms.loss.item() == pytest.approx(-0.5)
    assert terms.clipped_tokens.item() == 0
    terms.loss.backward()
    assert new_T.grad.item() == pytest.approx(-0.5)


def test_cispo_clips_the_weight_not_the_gradient():
    # ratio e^0.5 > 1.28: weight 1.28 (no grad through it); loss = -1.28 * A * new
    new_T = torch.tensor([0.5], requires_grad=True)
    terms = policy_loss(
        new_T,
        torch.zeros(1),
        torch.tensor([2.0]),
        torch.ones(1),
        normalizer=1.0,
        kind="cispo",
        clip_high=0.28,
    )
    assert terms.loss.item() == pytest.approx(-1.28 * 2.0 * 0.5)
    terms.loss.backward()
    assert new_T.grad.item() == pytest.approx(-1.28 * 2.0)


def test_k3_kl_term():
    # ref - new = d = 0.1: k3 = e^d - d - 1; added with kl_coef on top of the surrogate
    new_T = torch.tensor([-1.0])
    d = 0.1
    terms = policy_loss(
        new_T,
        new_T.clone(),
        torch.zeros(1),
        torch.ones(1),
        normalizer=1.0,
        ref_logprobs_T=new_T + d,
        kl_coef=0.5,
    )
    assert terms.kl_sum.item() == pytest.approx(math.exp(d) - d - 1, rel=1e-5)  # fp32
    assert terms.loss.item() == pytest.approx(0.5 * (math.exp(d) - d - 1), rel=1e-5)
