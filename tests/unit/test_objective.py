"""The GRPO maths against values computed by hand."""

import math

import pytest
import torch

from rlcoach.trainer.objective import (
    group_advantages,
    loss_normalizer,
    mismatch_metrics,
    policy_loss,
    sampler_mismatch,
    truncated_importance_weights,
)


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


def test_truncated_importance_weights_by_hand():
    # trainer - sampler = [+1.0, -0.5, +0.1]: weights e^1 = 2.718 capped at 2, e^-0.5, e^0.1
    trainer_T = torch.tensor([-1.0, -2.0, -0.4], requires_grad=True)
    sampler_T = torch.tensor([-2.0, -1.5, -0.5])
    weights_T = truncated_importance_weights(trainer_T, sampler_T, cap=2.0)
    assert weights_T.tolist() == pytest.approx([2.0, math.exp(-0.5), math.exp(0.1)], rel=1e-6)
    assert not weights_T.requires_grad


def test_tis_weights_each_token_and_takes_the_ratio_against_the_trainer():
    # On-policy for the trainer (ratio 1 against its own log-probs), off for the sampler:
    # token 0 sampler -1.0, trainer -0.5 -> w = min(e^0.5, 1.5) = 1.5;
    # token 1 sampler -1.0, trainer -1.2 -> w = e^-0.2. Loss = -(w0*A0 + w1*A1) / 2.
    new_T = torch.tensor([-0.5, -1.2], requires_grad=True)
    sampler_T = torch.tensor([-1.0, -1.0])
    advantages_T = torch.tensor([1.0, -2.0])
    terms = policy_loss(new_T, sampler_T, advantages_T, torch.ones(2), normalizer=2.0, tis_cap=1.5)
    w0, w1 = 1.5, math.exp(-0.2)
    assert terms.loss.item() == pytest.approx(-(w0 * 1.0 + w1 * -2.0) / 2, rel=1e-6)
    assert terms.ratio_sum.item() == pytest.approx(2.0)  # against the trainer: 1 per token
    assert terms.clipped_tokens.item() == 0
    terms.loss.backward()
    # d/d new of -w*exp(new - sg(new))*A/2 at ratio 1 is -w*A/2
    assert new_T.grad.tolist() == pytest.approx([-w0 * 1.0 / 2, -w1 * -2.0 / 2], rel=1e-6)


def test_tis_with_an_explicit_trainer_old_clips_against_it():
    # trainer at sampling weights: 0.0; now 0.5 -> ratio e^0.5 > 1.28 with A=+1: clipped.
    # sampler -0.2 -> w = min(e^0.2, 2) = e^0.2. Loss = -w * 1.28 * 1.
    new_T = torch.tensor([0.5], requires_grad=True)
    terms = policy_loss(
        new_T,
        torch.tensor([-0.2]),
        torch.ones(1),
        torch.ones(1),
        normalizer=1.0,
        tis_cap=2.0,
        trainer_old_logprobs_T=torch.zeros(1),
    )
    assert terms.loss.item() == pytest.approx(-math.exp(0.2) * 1.28, rel=1e-6)
    assert terms.clipped_tokens.item() == 1


def test_sampler_mismatch_by_hand():
    # trained tokens 0, 1, 3 (token 2 is context): d = trainer - sampler = 0.1, -0.3, 0.05
    trainer_T = torch.tensor([-1.0, -2.3, -9.0, -0.45])
    sampler_T = torch.tensor([-1.1, -2.0, 0.0, -0.5])
    terms = sampler_mismatch(trainer_T, sampler_T, torch.tensor([1, 1, 0, 1]), threshold=0.2)
    deltas = [0.1, -0.3, 0.05]
    assert terms.tokens == 3
    assert terms.abs_sum == pytest.approx(0.45, rel=1e-5)
    assert terms.abs_max == pytest.approx(0.3, rel=1e-5)
    assert terms.k3_sum == pytest.approx(sum(math.exp(d) - d - 1 for d in deltas), rel=1e-4)
    assert terms.beyond == 1
    empty = sampler_mismatch(trainer_T, sampler_T, torch.zeros(4), threshold=0.2)
    metrics = mismatch_metrics([terms, empty])
    assert metrics["mismatch_abs_mean"] == pytest.approx(0.15, rel=1e-5)
    assert metrics["mismatch_abs_max"] == pytest.approx(0.3, rel=1e-5)
    assert metrics["mismatch_beyond_fraction"] == pytest.approx(1 / 3)
    assert mismatch_metrics([])["mismatch_kl_k3"] == 0.0


def test_the_loss_reports_the_mismatch_against_the_sampler_even_with_tis():
    trainer_T = torch.tensor([-1.0, -2.3])
    sampler_T = torch.tensor([-1.1, -2.0])
    for cap in (None, 2.0):
        terms = policy_loss(
            trainer_T, sampler_T, torch.ones(2), torch.ones(2), normalizer=2.0, tis_cap=cap
        )
        assert terms.mismatch.tokens == 2 and terms.mismatch.beyond == 1
        assert terms.mismatch.abs_max == pytest.approx(0.3, rel=1e-5)


@pytest.mark.parametrize(("mini_batches", "tis_cap"), [(1, None), (2, 2.0)])
def test_a_step_records_the_mismatch_at_the_sampling_weights(tiny_model, mini_batches, tis_cap):
    """The sampler's log-probs are the trainer's own shifted by known amounts: the step's
    metrics are those shifts. With two mini-batches the second is measured at the
    sampling weights too (TIS's no-grad pass), not after the first optimizer step."""
    import sys
    from pathlib import Path

    from rlcoach.config import TrainConfig
    from rlcoach.trainer.lora import LoraTrainer
    from rlcoach.trainer.sequences import build_sequences, pack_sequences

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from tiny_llama import tiny_groups

    config = TrainConfig(
        learning_rate=1e-2,
        micro_batch_tokens=64,
        seed=3,
        mini_batches=mini_batches,
        tis_cap=tis_cap,
    )
    trainer = LoraTrainer(tiny_model, config, device="cpu")
    groups = tiny_groups(0)
    shifts = []  # sampler - trainer, on the tokens that train (group 3 has no variance)
    for number, group in enumerate(groups):
        for trajectory in group.trajectories:
            [sequence] = build_sequences(trajectory, 1.0)
            [row] = pack_sequences([sequence], len(sequence.token_ids))
            with torch.no_grad():
                own = trainer.row_logprobs(row)[-len(trajectory.choices[0].token_ids) :]
            shift = [0.3 if i % 4 == 0 else -0.05 for i in range(len(own))]
            trajectory.choices[0].logprobs = [float(o) + s for o, s in zip(own, shift, strict=True)]
            if number != 2:
                shifts += shift

    stats = trainer.step(groups)

    d = torch.tensor([-s for s in shifts], dtype=torch.float64)
    assert stats.mismatch_abs_mean == pytest.approx(float(d.abs().mean()), abs=0.02)
    assert stats.mismatch_abs_max == pytest.approx(0.3, abs=0.05)
    k3 = float((torch.exp(d) - d - 1).mean())
    assert stats.mismatch_kl_k3 == pytest.approx(k3, abs=0.01)
    assert stats.mismatch_beyond_fraction == pytest.approx(float((d.abs() > 0.2).double().mean()))
