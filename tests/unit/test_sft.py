"""SFT data: chat records become sequences whose mask covers exactly the assistant turns,
with the bundled model's real tokenizer and tool-calling template; client-side capture of
a plain model's chat completions (streamed and not) assembles conversations."""

import json

import pytest
import torch

from rlcoach.config import SFTConfig
from rlcoach.engines.stream import streamed_completion
from rlcoach.errors import TrainingDataError
from rlcoach.rollout.capture import _conversations
from rlcoach.trainer.sft import _batches, chat_sequences, sft_loss, sft_sequences
from rlcoach.trajectory.exchange import Exchange
from rlcoach.trajectory.trajectories import ChatRecord, SampledChoice, Trajectory

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    }
]

CONVERSATION = [
    {"role": "system", "content": "You add numbers with the add tool."},
    {"role": "user", "content": "What is 12 + 30?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "add", "arguments": json.dumps({"a": 12, "b": 30})},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "42"},
    {"role": "assistant", "content": "12 + 30 = 42."},
]


def masked_text(tokenizer, sequence, value):
    ids = [t for t, m in zip(sequence.token_ids, sequence.sampled_mask, strict=True) if m == value]
    return tokenizer.decode(ids)


def test_mask_covers_the_assistant_turns_and_nothing_else(tokenizer):
    [sequence] = chat_sequences(ChatRecord(messages=CONVERSATION, tools=TOOLS), tokenizer)
    trained = masked_text(tokenizer, sequence, 1)
    context = masked_text(tokenizer, sequence, 0)
    assert '"name": "add"' in trained and "12 + 30 = 42." in trained
    assert trained.count("<|im_end|>") == 2  # each turn learns to stop
    assert "What is 12 + 30?" in context and "42</tool_response>" in context.replace("\n", "")
    assert "What is 12 + 30?" not in trained and "You add numbers" not in trained
    assert "<tools>" in context  # the tools are in the prompt, as the engine renders them
    # the sequence is exactly the whole conversation rendered by the template
    full = tokenizer.apply_chat_template(
        CONVERSATION, tools=TOOLS, tokenize=True, return_dict=False
    )
    assert sequence.token_ids == list(full)


def test_records_without_an_assistant_turn_or_role_are_refused(tokenizer):
    with pytest.raises(TrainingDataError, match="no assistant message"):
        chat_sequences(ChatRecord(messages=CONVERSATION[:2]), tokenizer)
    with pytest.raises(ValueError, match="no valid role"):
        ChatRecord(messages=[{"content": "hi"}])
    with pytest.raises(TrainingDataError, match="Trajectory or ChatRecord"):
        sft_sequences([{"messages": CONVERSATION}], tokenizer)


def test_recorded_trajectories_train_on_their_sampled_tokens(tokenizer):
    choice = SampledChoice(
        message={"role": "assistant", "content": "4"},
        finish_reason="stop",
        prompt_token_ids=[1, 2, 3],
        token_ids=[7, 8],
        logprobs=[-0.1, -0.2],
        policy="m@0",
    )
    recorded = Trajectory(
        messages=[{"role": "user", "content": "2+2?"}, choice.message], choices=[choice]
    )
    teacher = Trajectory(messages=CONVERSATION, tools=TOOLS)  # messages only: rendered
    first, second = sft_sequences([recorded, teacher], tokenizer)
    assert first.token_ids == [1, 2, 3, 7, 8] and first.sampled_mask == [0, 0, 0, 1, 1]
    assert second.trajectory_id == teacher.id and second.sampled_tokens > 10


def test_loss_and_batches():
    logprobs_T = torch.tensor([-1.0, -2.0, -3.0])
    assert float(sft_loss(logprobs_T, torch.tensor([0.0, 1.0, 1.0]), 2.0)) == pytest.approx(2.5)
    sequences = list(range(10))
    batches = _batches(sequences, SFTConfig(epochs=2, batch_size=4, seed=3))
    assert [len(b) for b in batches] == [4, 4, 2, 4, 4, 2]
    assert sorted(i for b in batches[:3] for i in b) == sequences  # each epoch: each once
    assert batches == _batches(sequences, SFTConfig(epochs=2, batch_size=4, seed=3))


def test_streamed_completion_is_merged_into_one_message():
    chunks = [
        {
            "id": "c1",
            "model": "t",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Let me"}}],
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "content": " add.",
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_9",
                                "function": {"name": "add", "arguments": '{"a": '},
                            }
                        ],
                    },
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "delta": {
                        "tool_calls": [{"index": 0, "function": {"arguments": '1, "b": 2}'}}]
                    },
                }
            ]
        },
    ]
    text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    merged = streamed_completion(text)
    message = merged["choices"][0]["message"]
    assert message["content"] == "Let me add."
    assert message["tool_calls"][0]["id"] == "call_9"
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"a": 1, "b": 2}
    assert merged["choices"][0]["finish_reason"] == "tool_calls" and merged["id"] == "c1"


def test_captured_calls_group_into_conversations():
    def reply(text):
        return {"choices": [{"message": {"role": "assistant", "content": text}}]}

    first = [{"role": "user", "content": "q"}]
    second = [*first, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "more"}]
    summary = [{"role": "user", "content": "summarise"}]
    histories = _conversations(
        [
            Exchange({"messages": first}, reply("a1")),
            Exchange({"messages": summary}, reply("s")),
            Exchange({"messages": second}, reply("a2")),
        ]
    )
    assert [len(h.messages) for h in histories] == [4, 2]
    assert histories[0].messages[-1]["content"] == "a2"


def test_examples_framed_alike_share_their_prefix_and_train_as_unshared(tiny_model, monkeypatch):
    """Worked examples of one agent start with the same system prompt and tools: a batch
    runs that prefix once (trainer/sequences.py) and trains as the unshared packing does
    (the same loss up to rounding, on the tiny random Llama in this CPU's dtype; shared
    rows' log-probs and gradients are checked in test_prefix_sharing.py)."""
    from rlcoach.config import TrainConfig
    from rlcoach.trainer import sft
    from rlcoach.trainer.lora import LoraTrainer
    from rlcoach.trainer.sequences import SharedPrefix, TrainSequence, pack_shared

    prompt = list(range(10, 90))
    sequences = [
        TrainSequence(
            [*prompt, *range(100 + 9 * i, 109 + 9 * i)],
            [0] * 80 + [1] * 9,
            [0.0] * 89,
            1.0,
            f"t{i}",
        )
        for i in range(4)
    ]
    config = SFTConfig(epochs=2, batch_size=4, learning_rate=1e-3, micro_batch_tokens=1024)
    ran: list[int] = []

    def counted(units, max_tokens):
        rows = pack_shared(units, max_tokens)
        ran.extend(int(r.input_ids_T.shape[0]) for r in rows)
        return rows

    monkeypatch.setattr(sft, "pack_shared", counted)

    def train() -> float:
        trainer = LoraTrainer(tiny_model, TrainConfig(seed=0), device="cpu")
        return sft.sft_train(trainer, sequences, config).loss_first

    shared_loss = train()
    assert ran == [80 + 4 * 9] * 2  # the prompt once a batch, not four times
    monkeypatch.setattr(sft, "share_prefixes", lambda s, m: [SharedPrefix(0, (x,)) for x in s])
    assert train() == pytest.approx(shared_loss, rel=1e-2)  # the same loss, up to rounding
    assert ran[2:] == [4 * 89] * 2
