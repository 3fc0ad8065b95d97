"""Client-built trajectories rendered with the bundled model's real chat template."""

import copy
import math

import pytest
import torch

from rlcoach import TrainingDataError, Trajectory, TrajectoryGroup
from rlcoach.trainer.objective import policy_loss
from rlcoach.trainer.render import CLIENT_POLICY, client_built, render_groups
from rlcoach.trainer.sequences import build_sequences

QUESTION = [
    {"role": "system", "content": "You add numbers."},
    {"role": "user", "content": "2+3?"},
]


def _ids(tokenizer, messages, generation):
    return tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=generation, return_dict=False
    )


def _render(tokenizer, *trajectories):
    (group,), stats = render_groups([TrajectoryGroup(trajectories)], tokenizer)
    return group.trajectories, stats


def test_plain_messages_are_rendered_turn_by_turn(tokenizer):
    messages = [
        *QUESTION,
        {"role": "assistant", "content": "5"},
        {"role": "user", "content": "and 4+4?"},
        {"role": "assistant", "content": "8"},
    ]
    (rendered,), stats = _render(tokenizer, Trajectory(messages=messages, reward=1.0))
    first, second = rendered.choices
    assert first.prompt_token_ids == _ids(tokenizer, messages[:2], True)
    assert tokenizer.decode(first.token_ids) == "5<|im_end|>"  # the template's "\n" is context
    assert first.policy == CLIENT_POLICY and all(math.isnan(x) for x in first.logprobs)
    assert stats.tokens_retokenized == len(first.token_ids) + len(second.token_ids)
    assert stats.tokens_without_sampler_logprobs == stats.tokens_retokenized
    (sequence,) = build_sequences(rendered, 1.0)  # both turns in one sequence
    assert sequence.sampled_tokens == stats.tokens_retokenized
    assert sequence.token_ids == _ids(tokenizer, messages, False)[: len(sequence.token_ids)]


def test_choices_bring_their_ids_and_their_logprobs(tokenizer):
    reply_ids = tokenizer("5", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    exact = {
        "index": 0,
        "finish_reason": "stop",
        "message": {"role": "assistant", "content": "5"},
        "token_ids": reply_ids,
        "logprobs": {
            "content": [
                {"token": "x", "logprob": -0.25, "bytes": None, "top_logprobs": []}
                for _ in reply_ids
            ]
        },
    }
    by_text = copy.deepcopy(exact)
    del by_text["token_ids"]
    by_text["logprobs"]["content"][0]["token"] = "5"  # lines up; the end token does not
    plain_context = {"role": "assistant", "content": "4"}
    with_ids = Trajectory(messages_and_choices=[*QUESTION, plain_context, *QUESTION[1:], exact])
    (a, b), stats = _render(
        tokenizer, with_ids, Trajectory(messages_and_choices=[*QUESTION, by_text])
    )
    assert len(a.choices) == 1  # the plain assistant message is context, as in ART
    assert a.choices[0].token_ids == reply_ids and a.choices[0].logprobs == [-0.25] * 2
    assert b.choices[0].logprobs[0] == -0.25 and math.isnan(b.choices[0].logprobs[1])
    assert stats.tokens_retokenized == 2 and stats.tokens_without_sampler_logprobs == 1


def test_recorded_trajectories_pass_untouched(tokenizer):
    group = TrajectoryGroup([Trajectory(reward=1.0)])
    assert not client_built([group])
    assert render_groups([group], tokenizer)[0][0] is group


@pytest.mark.parametrize(
    ("message", "match"),
    [
        ({"role": "function", "content": "5"}, r"message 2 \(role 'function'\).*fix: use system"),
        (
            {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "add"}}]},
            r"message 2 \(role 'assistant'\) has a tool call without an id.*fix:",
        ),
        ({"role": "tool", "content": "5"}, r"message 2 \(role 'tool'\).*without a tool_call_id"),
    ],
)
def test_messages_no_template_renders_are_refused(tokenizer, message, match):
    bad = Trajectory(messages=[*QUESTION, message, {"role": "assistant", "content": "5"}])
    with pytest.raises(TrainingDataError, match=match) as error:
        _render(tokenizer, bad)
    assert repr(bad.id) in str(error.value)


def test_a_role_the_template_drops_is_refused(model_path):
    from transformers import AutoTokenizer

    dropping = AutoTokenizer.from_pretrained(model_path)
    dropping.chat_template = (
        "{% for m in messages %}{% if m.role != 'system' %}<|im_start|>{{ m.role }}\n"
        "{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    bad = Trajectory(messages=[*QUESTION, {"role": "assistant", "content": "5"}])
    with pytest.raises(TrainingDataError, match=r"message 0 \(role 'system'\) is dropped"):
        _render(dropping, bad)


def test_a_missing_behaviour_logprob_is_the_policys_own():
    new_T = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    old_T = torch.tensor([0.0, float("nan"), -0.8])
    mask_T = torch.tensor([0.0, 1.0, 1.0])
    terms = policy_loss(new_T, old_T, torch.ones(3), mask_T, normalizer=2.0)
    assert float(terms.ratio_sum) == pytest.approx(1.0 + math.exp(0.3))
    terms.loss.backward()
    assert torch.isfinite(new_T.grad).all() and new_T.grad[1] != 0
    # the mismatch is measured on the one token that has a sampler log-prob
    assert terms.mismatch.tokens == 1.0
    assert terms.mismatch.abs_sum == pytest.approx(0.3) and terms.mismatch.beyond == 1.0


def test_a_missing_behaviour_logprob_under_tis_is_the_trainers_at_sampling():
    """With TIS and a later mini-batch, the NaN becomes the trainer's log-prob at the
    sampling weights: ratio against it, TIS weight 1, no mismatch term."""
    new_T = torch.tensor([-1.0, -1.5], requires_grad=True)
    trainer_old_T = torch.tensor([-1.2, -1.5])
    old_T = torch.tensor([float("nan"), float("nan")])
    terms = policy_loss(
        new_T,
        old_T,
        torch.ones(2),
        torch.ones(2),
        normalizer=2.0,
        tis_cap=2.0,
        trainer_old_logprobs_T=trainer_old_T,
    )
    assert float(terms.ratio_sum) == pytest.approx(math.exp(0.2) + 1.0)
    assert terms.mismatch.tokens == 0.0 and math.isfinite(terms.loss.item())
