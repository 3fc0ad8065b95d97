"""Family detection, LoRA targets, fallback templates and the family templates' text."""

import json

import pytest

from rlcoach.models.families import (
    FAMILIES,
    fallback_chat_template,
    family_named,
    family_of,
    lora_targets,
)


def _folder(tmp_path, model_type, tokens=(), template=None):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    added = {str(i): {"content": t, "special": True} for i, t in enumerate(tokens)}
    config = {"added_tokens_decoder": added}
    if template is not None:
        config["chat_template"] = template
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize(
    ("model_type", "tokens", "family"),
    [
        ("llama", ["<|begin_of_text|>", "<|start_header_id|>", "<|eot_id|>"], "llama3"),
        ("llama", ["<|im_start|>", "<|im_end|>"], "smollm2"),
        ("llama", ["<s>", "[INST]", "[TOOL_CALLS]"], "mistral"),
        ("mistral", ["<s>"], "mistral"),
        ("qwen3", ["<|im_start|>"], "qwen3"),
        ("gemma3_text", ["<start_of_turn>"], "gemma3"),
        ("gpt_oss", [], "gpt-oss"),
    ],
)
def test_a_folder_is_matched_by_model_type_then_control_tokens(
    tmp_path, model_type, tokens, family
):
    assert family_of(_folder(tmp_path, model_type, tokens)) == family_named(family)


def test_an_unlisted_architecture_has_no_family_and_gets_all_linear(tmp_path):
    folder = _folder(tmp_path, "falcon")
    assert family_of(folder) is None
    assert lora_targets("auto", folder) == "all-linear"
    assert fallback_chat_template(folder) is None
    assert lora_targets(["q_proj"], folder) == ["q_proj"]


def test_gpt_oss_adapts_attention_only(tmp_path):
    folder = _folder(tmp_path, "gpt_oss")
    assert lora_targets("auto", folder) == ["q_proj", "k_proj", "v_proj", "o_proj"]


def test_a_folder_without_a_template_gets_its_familys_and_its_own_wins(tmp_path):
    bare = _folder(tmp_path, "gemma3_text", ["<start_of_turn>"])
    assert fallback_chat_template(bare) == family_named("gemma3").chat_template
    _folder(tmp_path, "gemma3_text", ["<start_of_turn>"], template="{{ messages }}")
    assert fallback_chat_template(tmp_path) is None


def test_unknown_family_name_lists_the_known_ones():
    with pytest.raises(KeyError, match="qwen3"):
        family_named("falcon")


CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "f", "arguments": {"flag": True, "none": None, "n": 2, "s": "x"}},
        }
    ],
}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("family", "expected"),
    [
        ("gemma3", '<start_of_turn>model\n[f(flag=True, none=None, n=2, s="x")]<end_of_turn>'),
        ("llama3", '{"name": "f", "parameters": {"flag": true, "none": null, "n": 2, "s": "x"}}'),
        ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {"flag": true, "none": null, '),
        ("qwen3", '<tool_call>\n{"name": "f", "arguments": {"flag": true, "none": null, '),
    ],
)
def test_family_templates_write_calls_in_their_format(tokenizer, family, expected):
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, CALL]
    template = family_named(family).chat_template
    text = tokenizer.apply_chat_template(
        messages, tools=[TOOL], tokenize=False, chat_template=template
    )
    assert expected in text
    assert text.count("S") >= 1 and "U" in text


def test_every_family_with_a_template_renders_a_plain_chat(tokenizer):
    messages = [{"role": "user", "content": "hello"}]
    for family in FAMILIES:
        if family.chat_template is None:
            continue
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, chat_template=family.chat_template
        )
        assert "hello" in text, family.name
