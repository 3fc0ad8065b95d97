"""What differs between model families, in one place.

A model folder is matched to a family by its `config.json` `model_type` and, where
families share an architecture (SmolLM2, Llama 3 and some Mistral models are all
`llama`), by the control tokens its tokenizer carries. A family says:

- which modules LoRA adapts (the attention and MLP projections; never a MoE router or
  the embeddings, which vLLM cannot serve adapters for);
- which vLLM tool-call parser reads the tool calls its chat template asks for, and which
  reasoning parser splits its thinking blocks off;
- a chat template of the family's format (written here, in rlcoach's words) for folders
  that carry none — base models converted from GGUF files have no chat template;
- how reasoning blocks and the system prompt are handled, and whether the template must
  begin with the BOS token.

Sampling and training agree on reasoning blocks by construction: the trainer trains the
exact token ids the engine sampled, and a turn whose history the template re-renders
differently (Qwen3 drops `<think>` blocks of earlier turns) becomes a training sequence
of its own instead of being re-tokenized (see `trainer/sequences.py`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlcoach.errors import UnknownNameError
from rlcoach.models.chat_template import TEXT_MACRO, TOOL_CHAT_TEMPLATE, jinja_literal

__all__ = [
    "FAMILIES",
    "Family",
    "fallback_chat_template",
    "family_named",
    "family_of",
    "lora_targets",
]

_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# Shared Jinja pieces. Every literal the model sees is written as a Jinja string, so the
# template's own line breaks never leak into the rendered text.
_TEXT = (
    TEXT_MACRO
    + r"""
{%- macro args_json(fn) -%}
  {%- if fn.arguments is string -%}{{ fn.arguments }}
  {%- else -%}{{ fn.arguments | tojson }}
  {%- endif -%}
{%- endmacro -%}
{%- if messages and messages[0].role == 'system' -%}
  {%- set system = text(messages[0].content) -%}
  {%- set rest = messages[1:] -%}
{%- else -%}
  {%- set system = '' -%}
  {%- set rest = messages -%}
{%- endif -%}
{%- set ns = namespace(last_user=-1, tools_shown=false) -%}
{%- for m in rest -%}
  {%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}
{%- endfor -%}
"""
)

_QWEN3 = r"""
{%- if tools -%}
  {{- '<|im_start|>system\n' -}}
  {%- if system -%}{{- system + '\n\n' -}}{%- endif -%}
  {{- QWEN_TOOLS_PREAMBLE -}}
  {%- for tool in tools -%}
    {{- '\n' -}}{{- (tool.function if tool.function is defined else tool) | tojson -}}
  {%- endfor -%}
  {{- QWEN_TOOLS_INSTRUCTION + '<|im_end|>\n' -}}
{%- elif system -%}
  {{- '<|im_start|>system\n' + system + '<|im_end|>\n' -}}
{%- endif -%}
{%- for m in rest -%}
  {%- set i = loop.index0 -%}
  {%- if m.role == 'assistant' -%}
    {%- set content = text(m.content) | string -%}
    {%- set reasoning = (m.reasoning_content or m.reasoning or '') | string -%}
    {%- if '</think>' in content -%}
      {%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\n') -%}
      {%- set content = content.split('</think>')[-1].lstrip('\n') -%}
    {%- endif -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if i > ns.last_user and (loop.last or reasoning) -%}
      {{- '<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' -}}
    {%- endif -%}
    {{- content -}}
    {%- for call in (m.tool_calls or []) -%}
      {%- set fn = call.function if call.function is defined else call -%}
      {%- if content or not loop.first -%}{{- '\n' -}}{%- endif -%}
      {{- '<tool_call>\n{"name": "' + fn.name + '", "arguments": ' + args_json(fn) -}}
      {{- '}\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\n' -}}
  {%- elif m.role == 'tool' -%}
    {%- if i == 0 or rest[i - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\n<tool_response>\n' + text(m.content) + '\n</tool_response>' -}}
    {%- if loop.last or rest[i + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
  {%- else -%}
    {{- '<|im_start|>' + m.role + '\n' + text(m.content) + '<|im_end|>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
  {%- if enable_thinking is defined and enable_thinking is false -%}
    {{- '<think>\n\n</think>\n\n' -}}
  {%- endif -%}
{%- endif -%}
"""

_LLAMA3 = r"""
{{- bos_token -}}
{{- '<|start_header_id|>system<|end_header_id|>\n\n' -}}
{%- if tools -%}{{- 'Environment: ipython\n' -}}{%- endif -%}
{{- 'Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n' + system + '<|eot_id|>' -}}
{%- for m in rest -%}
  {%- if m.role == 'user' and tools and not ns.tools_shown -%}
    {%- set ns.tools_shown = true -%}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' + LLAMA_TOOLS_PREAMBLE -}}
    {%- for tool in tools -%}
      {{- (tool.function if tool.function is defined else tool) | tojson(indent=4) + '\n\n' -}}
    {%- endfor -%}
    {{- text(m.content) + '<|eot_id|>' -}}
  {%- elif m.role == 'assistant' -%}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' + text(m.content) -}}
    {%- for call in (m.tool_calls or []) -%}
      {%- set fn = call.function if call.function is defined else call -%}
      {%- if not loop.first -%}{{- '; ' -}}{%- endif -%}
      {{- '{"name": "' + fn.name + '", "parameters": ' + args_json(fn) + '}' -}}
    {%- endfor -%}
    {{- '<|eot_id|>' -}}
  {%- elif m.role == 'tool' -%}
    {{- '<|start_header_id|>ipython<|end_header_id|>\n\n' + text(m.content) + '<|eot_id|>' -}}
  {%- else -%}
    {{- '<|start_header_id|>' + m.role + '<|end_header_id|>\n\n' -}}
    {{- text(m.content) + '<|eot_id|>' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
{%- endif -%}
"""

# Gemma has no system or tool role: the system prompt and the tool list open the first
# user turn, tool results come back in a user turn, and calls are a Python-style list.
_GEMMA3 = r"""
{%- macro py(value) -%}
  {%- if value is sameas true -%}{{- 'True' -}}
  {%- elif value is sameas false -%}{{- 'False' -}}
  {%- elif value is none -%}{{- 'None' -}}
  {%- else -%}{{- value | tojson -}}
  {%- endif -%}
{%- endmacro -%}
{{- bos_token -}}
{%- for m in rest -%}
  {%- set i = loop.index0 -%}
  {%- if m.role == 'tool' -%}
    {%- if i == 0 or rest[i - 1].role != 'tool' -%}{{- '<start_of_turn>user\n' -}}{%- endif -%}
    {{- '```tool_output\n' + text(m.content) + '\n```\n' -}}
    {%- if loop.last or rest[i + 1].role != 'tool' -%}{{- '<end_of_turn>\n' -}}{%- endif -%}
  {%- else -%}
    {{- '<start_of_turn>' + ('model' if m.role == 'assistant' else 'user') + '\n' -}}
    {%- if m.role == 'user' and not ns.tools_shown -%}
      {%- set ns.tools_shown = true -%}
      {%- if system -%}{{- system + '\n\n' -}}{%- endif -%}
      {%- if tools -%}
        {{- GEMMA_TOOLS_PREAMBLE -}}
        {%- for tool in tools -%}
          {{- (tool.function if tool.function is defined else tool) | tojson + '\n' -}}
        {%- endfor -%}
        {{- '\n' -}}
      {%- endif -%}
    {%- endif -%}
    {{- text(m.content) | trim -}}
    {%- if m.tool_calls -%}
      {{- '[' -}}
      {%- for call in m.tool_calls -%}
        {%- set fn = call.function if call.function is defined else call -%}
        {%- if fn.arguments is string -%}
          {{- raise_exception(GEMMA_STRING_ARGUMENTS) -}}
        {%- endif -%}
        {%- if not loop.first -%}{{- ', ' -}}{%- endif -%}
        {{- fn.name + '(' -}}
        {%- for key, value in fn.arguments.items() -%}
          {%- if not loop.first -%}{{- ', ' -}}{%- endif -%}
          {{- key + '=' + py(value) -}}
        {%- endfor -%}
        {{- ')' -}}
      {%- endfor -%}
      {{- ']' -}}
    {%- endif -%}
    {{- '<end_of_turn>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<start_of_turn>model\n' -}}{%- endif -%}
"""

# Mistral v3 tokenizers (before `[ARGS]`): the tool list sits just before the last user
# turn, the system prompt inside it, and calls are a JSON list after `[TOOL_CALLS]`.
_MISTRAL = r"""
{{- bos_token -}}
{%- for m in rest -%}
  {%- if m.role == 'user' -%}
    {%- if tools and loop.index0 == ns.last_user -%}
      {{- '[AVAILABLE_TOOLS]' + (tools | tojson) + '[/AVAILABLE_TOOLS]' -}}
    {%- endif -%}
    {{- '[INST]' -}}
    {%- if system and loop.index0 == ns.last_user -%}{{- system + '\n\n' -}}{%- endif -%}
    {{- text(m.content) + '[/INST]' -}}
  {%- elif m.role == 'assistant' and m.tool_calls -%}
    {{- '[TOOL_CALLS][' -}}
    {%- for call in m.tool_calls -%}
      {%- set fn = call.function if call.function is defined else call -%}
      {%- if not loop.first -%}{{- ', ' -}}{%- endif -%}
      {{- '{"name": "' + fn.name + '", "arguments": ' + args_json(fn) + '}' -}}
    {%- endfor -%}
    {{- ']' + eos_token -}}
  {%- elif m.role == 'assistant' -%}
    {{- text(m.content) + eos_token -}}
  {%- elif m.role == 'tool' -%}
    {{- '[TOOL_RESULTS]{"content": ' + (text(m.content) | string | tojson) + '}[/TOOL_RESULTS]' -}}
  {%- endif -%}
{%- endfor -%}
"""


_LITERALS = {
    "QWEN_TOOLS_PREAMBLE": (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    ),
    "QWEN_TOOLS_INSTRUCTION": (
        "\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    ),
    "LLAMA_TOOLS_PREAMBLE": (
        "Given the following functions, please respond with a JSON for a function call with "
        "its proper arguments that best answers the given prompt.\n\nRespond in the format "
        '{"name": function name, "parameters": dictionary of argument name and its value}. '
        "Do not use variables.\n\n"
    ),
    "GEMMA_TOOLS_PREAMBLE": (
        "You can call these functions. To call any, answer with only a Python list of calls, "
        "like [name(arg1=value1, arg2=value2)]:\n"
    ),
    "GEMMA_STRING_ARGUMENTS": (
        "pythonic tool calls need their arguments as an object, not a JSON string"
    ),
}


def _template(body: str) -> str:
    text = (_TEXT + body).strip()
    for name, literal in _LITERALS.items():
        text = text.replace(name, jinja_literal(literal))
    return text


@dataclass(frozen=True, slots=True)
class Family:
    """What rlcoach needs to know about one model family."""

    name: str
    title: str
    model_types: tuple[str, ...]
    markers: tuple[str, ...]
    """Tokens the tokenizer must hold (tells apart families that share a model type)."""
    lora_targets: tuple[str, ...]
    tool_call_parser: str
    """vLLM's parser for the tool calls this family's template asks for."""
    reasoning_parser: str | None
    chat_template: str | None
    """The family's format, for model folders without a chat template of their own."""
    needs_bos: bool
    reasoning: str
    """How reasoning blocks go through a multi-turn rollout."""
    system_prompt: str
    """Where the system prompt goes (and its default)."""
    control_tokens: tuple[str, ...] = ()
    """Format tokens the model never writes inside a reply (turn headers, ends)."""
    reply_tokens: tuple[str, ...] = ()
    """Format tokens the model writes inside a reply (tool-call and reasoning markers)."""
    end_of_turn: str = ""

    def as_row(self) -> dict[str, Any]:
        return {
            "family": self.title,
            "tool parser": self.tool_call_parser,
            "reasoning parser": self.reasoning_parser or "-",
            "LoRA targets": ", ".join(self.lora_targets),
            "BOS": self.needs_bos,
        }


FAMILIES: tuple[Family, ...] = (
    Family(
        name="qwen3",
        title="Qwen3 (dense)",
        model_types=("qwen3",),
        markers=("<|im_start|>",),
        lora_targets=_PROJECTIONS,
        tool_call_parser="hermes",
        reasoning_parser="qwen3",
        chat_template=_template(_QWEN3),
        needs_bos=False,
        reasoning="`<think>` kept on turns after the last user message, dropped before it "
        "(an empty block closes the last turn, as `enable_thinking=False` writes it)",
        system_prompt="system turn; the tool list is appended to it",
        control_tokens=("<|im_start|>", "<|im_end|>"),
        reply_tokens=("<think>", "</think>", "<tool_call>", "</tool_call>"),
        end_of_turn="<|im_end|>",
    ),
    Family(
        name="llama3",
        title="Llama 3",
        model_types=("llama",),
        markers=("<|start_header_id|>", "<|eot_id|>"),
        lora_targets=_PROJECTIONS,
        tool_call_parser="llama3_json",
        reasoning_parser=None,
        chat_template=_template(_LLAMA3),
        needs_bos=True,
        reasoning="no reasoning blocks",
        system_prompt="system turn with the knowledge-cutoff lines; tools in the first user turn",
        control_tokens=(
            "<|begin_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
        ),
        reply_tokens=("<|python_tag|>",),
        end_of_turn="<|eot_id|>",
    ),
    Family(
        name="gemma3",
        title="Gemma 3 (text)",
        model_types=("gemma3_text", "gemma3"),
        markers=("<start_of_turn>",),
        lora_targets=_PROJECTIONS,
        tool_call_parser="pythonic",
        reasoning_parser=None,
        chat_template=_template(_GEMMA3),
        needs_bos=True,
        reasoning="no reasoning blocks",
        system_prompt="no system role: the system prompt and tools open the first user turn",
        control_tokens=("<bos>", "<start_of_turn>", "<end_of_turn>"),
        end_of_turn="<end_of_turn>",
    ),
    Family(
        name="smollm2",
        title="SmolLM2 (the bundled model)",
        model_types=("llama",),
        markers=("<|im_start|>",),
        lora_targets=_PROJECTIONS,
        tool_call_parser="hermes",
        reasoning_parser=None,
        chat_template=TOOL_CHAT_TEMPLATE,
        needs_bos=False,
        reasoning="no reasoning blocks",
        system_prompt="system turn, SmolLM's default when none is given; tools appended",
        control_tokens=("<|im_start|>", "<|im_end|>"),
        end_of_turn="<|im_end|>",
    ),
    Family(
        name="mistral",
        title="Mistral (v3 tokenizer)",
        model_types=("mistral", "llama"),
        markers=("[INST]", "[TOOL_CALLS]"),
        lora_targets=_PROJECTIONS,
        tool_call_parser="mistral",
        reasoning_parser=None,
        chat_template=_template(_MISTRAL),
        needs_bos=True,
        reasoning="no reasoning blocks",
        system_prompt="no system role: prepended to the last user turn",
        control_tokens=(
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
        ),
        reply_tokens=("[TOOL_CALLS]",),
        end_of_turn="</s>",
    ),
    Family(
        name="gpt-oss",
        title="gpt-oss (harmony)",
        model_types=("gpt_oss",),
        markers=(),
        # Attention only: the experts are fused 3-D parameters, not Linear layers, and the
        # router must stay as trained.
        lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"),
        tool_call_parser="openai",
        reasoning_parser="openai_gptoss",
        chat_template=None,
        needs_bos=False,
        reasoning="harmony channels (analysis / commentary / final), rendered by vLLM",
        system_prompt="harmony system and developer messages, rendered by vLLM",
    ),
)


def family_named(name: str) -> Family:
    for family in FAMILIES:
        if family.name == name:
            return family
    known = ", ".join(f.name for f in FAMILIES)
    raise UnknownNameError(
        f"no model family {name!r}: rlcoach has no chat template or LoRA targets for it; "
        f"fix: use one of {known}"
    )


def _vocabulary_markers(folder: Path) -> set[str]:
    """The added/special tokens of a tokenizer folder, read from its JSON files."""
    found: set[str] = set()
    tokenizer = folder / "tokenizer.json"
    if tokenizer.is_file():
        data = json.loads(tokenizer.read_text())
        found.update(t["content"] for t in data.get("added_tokens", []))
    config = folder / "tokenizer_config.json"
    if config.is_file():
        data = json.loads(config.read_text())
        found.update(t["content"] for t in data.get("added_tokens_decoder", {}).values())
        found.update(str(t) for t in data.get("extra_special_tokens", []) or [])
    return found


def family_of(folder: str | Path) -> Family | None:
    """The family of the model in `folder`, or None for an architecture not listed here."""
    folder = Path(folder)
    try:
        model_type = json.loads((folder / "config.json").read_text()).get("model_type")
    except (OSError, json.JSONDecodeError):
        return None
    candidates = [f for f in FAMILIES if model_type in f.model_types]
    if len(candidates) <= 1:
        return candidates[0] if candidates else None
    vocabulary = _vocabulary_markers(folder)
    matching = [f for f in candidates if all(m in vocabulary for m in f.markers)]
    # The most specific match wins (Mistral's markers over a bare Llama type).
    matching.sort(key=lambda f: (-len(f.markers), f.model_types.index(model_type)))
    return matching[0] if matching else None


def lora_targets(configured: list[str] | str, folder: str | Path) -> list[str] | str:
    """The modules LoRA adapts: `configured`, with "auto" resolved by the model's family
    (peft's "all-linear" for a family not listed here)."""
    if configured != "auto":
        return configured
    family = family_of(folder)
    return list(family.lora_targets) if family is not None else "all-linear"


def fallback_chat_template(folder: str | Path) -> str | None:
    """The family's chat template for a model folder that has none (a base model converted
    from GGUF, say), else None: a folder's own template always wins."""
    folder = Path(folder)
    if (folder / "chat_template.jinja").is_file():
        return None
    config = folder / "tokenizer_config.json"
    if config.is_file() and json.loads(config.read_text()).get("chat_template"):
        return None
    family = family_of(folder)
    return family.chat_template if family is not None else None
