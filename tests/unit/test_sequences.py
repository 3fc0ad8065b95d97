"""Training sequences and masks on the real SmolLM2 tokenizer, with tool calls.

The prompts are rendered by the bundled chat template, exactly as the engines render
them; the "sampled" ids are what a policy would have produced for those replies.
"""

import pytest
import torch

from rlcoach import SampledChoice, TrainingDataError, Trajectory
from rlcoach.demo.task import ADD_TOOL
from rlcoach.trainer.sequences import build_sequences, pack_sequences

CALL = {
    "id": "c1",
    "type": "function",
    "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
}
USER = [{"role": "user", "content": "What is 1 + 2?"}]
AFTER_CALL = [
    *USER,
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": "3"},
]


def _render(tokenizer, messages):
    return tokenizer.apply_chat_template(
        messages, tools=[ADD_TOOL], add_generation_prompt=True, tokenize=True, return_dict=False
    )


def _choice(prompt, sampled):
    return SampledChoice(
        message={"role": "assistant"},
        prompt_token_ids=prompt,
        token_ids=sampled,
        logprobs=[-0.5] * len(sampled),
        policy="p@0",
    )


def _two_turns(tokenizer, first_reply_ids):
    prompt1, prompt2 = _render(tokenizer, USER), _render(tokenizer, AFTER_CALL)
    final_ids = [*tokenizer.encode("1 + 2 = 3", add_special_tokens=False), tokenizer.eos_token_id]
    return Trajectory(choices=[_choice(prompt1, first_reply_ids), _choice(prompt2, final_ids)])


def _as_rendered(tokenizer):
    """The first reply's ids exactly as the template re-renders it in the next prompt."""
    prompt1, prompt2 = _render(tokenizer, USER), _render(tokenizer, AFTER_CALL)
    end = prompt2.index(tokenizer.eos_token_id, len(prompt1))
    return prompt2[len(prompt1) : end + 1]


def test_a_turn_that_extends_the_conversation_is_one_sequence(tokenizer):
    trajectory = _two_turns(tokenizer, _as_rendered(tokenizer))
    (sequence,) = build_sequences(trajectory, advantage=0.5)
    ids = torch.tensor(sequence.token_ids)
    mask = torch.tensor(sequence.sampled_mask, dtype=torch.bool)
    trained = tokenizer.decode(ids[mask])
    context = tokenizer.decode(ids[~mask])
    assert trained == (
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n'
        "</tool_call><|im_end|>1 + 2 = 3<|im_end|>"
    )
    # the tool result and the turn headers are context, never trained
    assert "<tool_response>\n3\n</tool_response>" in context
    assert context.endswith("<|im_start|>assistant\n")
    assert sequence.token_ids[: len(_render(tokenizer, USER))] == _render(tokenizer, USER)
    assert [
        lp for lp, m in zip(sequence.old_logprobs, sequence.sampled_mask, strict=True) if m
    ] == [-0.5] * sequence.sampled_tokens
    assert sequence.advantage == 0.5


def test_a_reply_the_template_renders_differently_starts_a_new_sequence(tokenizer):
    # The model spaced its JSON its own way; the next prompt holds the template's version.
    text = '<tool_call>\n{"name":"add","arguments":{"a":1,"b":2}}\n</tool_call>'
    odd = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
    trajectory = _two_turns(tokenizer, odd)
    first, second = build_sequences(trajectory, advantage=1.0)
    assert first.token_ids[-len(odd) :] == odd and first.sampled_tokens == len(odd)
    assert second.token_ids[: len(_render(tokenizer, AFTER_CALL))] == _render(tokenizer, AFTER_CALL)
    # every sampled token is trained exactly once
    total = sum(len(c.token_ids) for c in trajectory.choices)
    assert first.sampled_tokens + second.sampled_tokens == total


def test_a_trajectory_without_sampled_tokens_is_refused_with_the_fix():
    with pytest.raises(TrainingDataError, match=r"no sampled choice.*model\.rollout\(\)"):
        build_sequences(Trajectory(id="t-empty"), advantage=1.0)


def test_packing_keeps_every_sequence_and_restarts_positions(tokenizer):
    trajectory = _two_turns(tokenizer, _as_rendered(tokenizer))
    sequences = build_sequences(trajectory, 1.0) * 3
    length = len(sequences[0].token_ids)
    rows = pack_sequences(sequences, max_tokens=2 * length)
    assert [r.sequence_lengths for r in rows] == [(length, length), (length,)]
    assert rows[0].position_ids_T.tolist() == list(range(length)) * 2
    assert sum(int(r.sampled_mask_T.sum()) for r in rows) == 3 * sequences[0].sampled_tokens


def test_packed_logprobs_equal_unpacked(model_path):
    """Sequences packed in one row must not see each other (position ids reset)."""
    from transformers import AutoModelForCausalLM

    from rlcoach.trainer.lora import chunked_token_logprobs
    from rlcoach.trainer.sequences import TrainSequence

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    a = TrainSequence(list(range(100, 140)), [1] * 40, [0.0] * 40, 1.0, "a")
    b = TrainSequence(list(range(300, 325)), [1] * 25, [0.0] * 25, 1.0, "b")
    (row,) = pack_sequences([a, b], max_tokens=100)
    with torch.no_grad():
        packed = chunked_token_logprobs(model, row.input_ids_T[None], row.position_ids_T[None], 16)
        alone = [
            chunked_token_logprobs(
                model, torch.tensor([s.token_ids]), torch.arange(len(s.token_ids))[None], 16
            )
            for s in (a, b)
        ]
    # packed[i] predicts token i+1; the boundary position (a's last -> b's first) is unused
    torch.testing.assert_close(packed[:39], alone[0], atol=1e-4, rtol=0)
    torch.testing.assert_close(packed[40:], alone[1], atol=1e-4, rtol=0)


def test_segment_attention_matches_the_dense_mask_and_gradients(model_path):
    """The trainer's per-sequence attention (no [T x T] mask) gives the same log-probs
    and the same gradients as the block-diagonal mask path, for three packed sequences."""
    from transformers import AutoModelForCausalLM

    from rlcoach.trainer.attention import SEGMENT_ATTENTION, register_segment_attention
    from rlcoach.trainer.lora import chunked_token_logprobs
    from rlcoach.trainer.sequences import TrainSequence

    register_segment_attention()
    dense = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    fast = AutoModelForCausalLM.from_pretrained(
        model_path, dtype=torch.float32, attn_implementation=SEGMENT_ATTENTION
    )
    seqs = [
        TrainSequence(list(range(s, s + n)), [1] * n, [0.0] * n, 1.0, str(s))
        for s, n in ((100, 40), (300, 25), (700, 9))
    ]
    (row,) = pack_sequences(seqs, max_tokens=100)
    ids, positions = row.input_ids_T[None], row.position_ids_T[None]
    results = []
    for model in (dense, fast):
        logprobs = chunked_token_logprobs(model, ids, positions, 16)
        logprobs.sum().backward()
        grad = model.get_output_embeddings().weight.grad
        results.append((logprobs.detach(), grad[:1000].clone()))
    torch.testing.assert_close(results[1][0], results[0][0], atol=1e-4, rtol=0)
    torch.testing.assert_close(results[1][1], results[0][1], atol=1e-4, rtol=1e-3)
    with torch.no_grad():
        alone = chunked_token_logprobs(
            fast, torch.tensor([seqs[2].token_ids]), torch.arange(9)[None], 16
        )
    torch.testing.assert_close(results[1][0][-8:], alone, atol=1e-4, rtol=0)


def test_forced_tokens_stay_in_the_sequence_but_out_of_the_loss(tokenizer):
    prompt = _render(tokenizer, USER)
    reply = [*tokenizer.encode('{"mood": "happy"}', add_special_tokens=False)]
    reply.append(tokenizer.eos_token_id)
    # a JSON schema forced everything but the value's tokens (and the closing end of turn)
    value = set(range(len(reply)))
    value -= {i for i, t in enumerate(reply) if "happy" not in tokenizer.decode([t])}
    forced = sorted(set(range(len(reply))) - value)
    choice = _choice(prompt, reply).model_copy(update={"forced": forced, "constraint": "json"})
    (sequence,) = build_sequences(Trajectory(choices=[choice]), advantage=1.0)
    trained = [t for t, m in zip(sequence.token_ids, sequence.sampled_mask, strict=True) if m]
    assert trained == [reply[i] for i in sorted(value)] and "happy" in tokenizer.decode(trained)
    assert sum(sequence.forced_mask) == len(forced)
    assert sequence.token_ids[len(prompt) :] == reply  # forced tokens are still context
    # SFT imitates the whole reply, forced tokens included
    (imitated,) = build_sequences(Trajectory(choices=[choice]), 1.0, train_forced=True)
    assert imitated.sampled_tokens == len(reply)
    # a reply the constraint wrote entirely trains nothing and is not an error
    everything = choice.model_copy(update={"forced": list(range(len(reply)))})
    assert build_sequences(Trajectory(choices=[everything]), 1.0) == []


@pytest.mark.parametrize(
    ("logprobs", "reason", "policy"),
    [
        ([-0.5], "1 log-probs for 2 sampled tokens", "p@0"),
        ([-0.5, float("nan")], "not a finite number", "p@0"),
        ([-0.5, float("-inf")], "not a finite number", "p@0"),
        ([-0.5, 0.7], "above 0", "p@0"),
        ([-0.5, -9999.0], "vLLM's -inf", "p@0"),
        # a rendered client reply (trainer/render.py) may lack a log-prob, nothing else
        ([float("nan"), float("inf")], "not a finite number", "client"),
        ([float("nan"), 0.7], "above 0", "client"),
    ],
)
def test_log_probs_the_endpoint_cannot_return_are_refused_before_training(logprobs, reason, policy):
    choice = SampledChoice.model_construct(
        message={"role": "assistant"},
        prompt_token_ids=[1, 2],
        token_ids=[3, 4],
        logprobs=logprobs,
        forced=[],
        constraint=None,
        policy=policy,
    )
    # Built unvalidated: a Trajectory validates its choices on construction and assignment.
    trajectory = Trajectory.model_construct(id="t-bad", choices=[choice], additional_histories=[])
    with pytest.raises(TrainingDataError) as info:
        build_sequences(trajectory, advantage=1.0)
    message = str(info.value)
    assert "'t-bad'" in message and reason in message and "choice 0 of the main history" in message
    assert "fix: record the choice through the policy endpoint" in message


def test_shared_prefix_log_probs_and_gradients_equal_the_plain_ones(model_path, tokenizer):
    """Prefix sharing on the bundled SmolLM2-135M, the demo's real prompts (system prompt,
    worked examples, the add tool): two groups of three two-turn attempts; log-probs,
    loss and LoRA gradients as without sharing (tests/shared_prompts.py; the tiny
    model's check in either dtype is test_prefix_sharing.py)."""
    from shared_prompts import assert_shared_equals_plain, demo_groups, perturb_adapter

    from rlcoach.config import TrainConfig
    from rlcoach.trainer.lora import LoraTrainer

    config = TrainConfig(micro_batch_tokens=4096)
    trainer = LoraTrainer(model_path, config, device="cpu")
    perturb_adapter(trainer, seed=1)
    plain_tokens, shared_tokens = assert_shared_equals_plain(
        trainer, demo_groups(tokenizer, per_group=3), config
    )
    assert shared_tokens < 0.5 * plain_tokens
