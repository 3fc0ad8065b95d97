"""rlcoach's tool-calling chat template for ChatML models without one (the bundled SmolLM2).

SmolLM2's own template drops `tools=` silently, so a tool-using agent would train on
prompts that never mention its tools. This template keeps SmolLM2's ChatML layout and
default system prompt and adds the Hermes convention that vLLM's `hermes` tool parser
and rlcoach's own parser (`parse_tool_calls`) both read:

- tools are listed as JSON inside `<tools></tools>` in the system turn;
- the assistant calls a tool with `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`;
- a tool result comes back as a user turn wrapped in `<tool_response></tool_response>`.

An assistant turn with `tool_calls` is rendered exactly the way the model is asked to
write it, so a re-sent conversation usually re-tokenizes to the ids that were sampled and
the trainer can keep a multi-turn rollout as one sequence.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

__all__ = [
    "TEXT_MACRO",
    "TOOL_CHAT_TEMPLATE",
    "jinja_literal",
    "parse_tool_calls",
    "template_messages",
]

_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

_TOOLS_PREAMBLE = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_INSTRUCTION = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)

# Jinja whitespace control (`{%-`, `-%}`) keeps the template's own newlines out of the
# rendered text; every newline the model sees is written as a literal '\n' string.
TEXT_MACRO = r"""
{%- macro text(content) -%}
  {%- if content is string -%}{{ content }}
  {%- elif content is iterable -%}
    {%- for part in content -%}
      {%- if part.type == 'text' -%}{{ part.text }}{%- endif -%}
    {%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
"""
"""`text(content)`: a message's content as text, whether a string or a list of parts
(vLLM passes content as parts); every template of ours starts with it."""

_TEMPLATE = (
    TEXT_MACRO
    + r"""
{%- if messages and messages[0].role == 'system' -%}
  {%- set system = text(messages[0].content) -%}
  {%- set rest = messages[1:] -%}
{%- else -%}
  {%- set system = DEFAULT_SYSTEM -%}
  {%- set rest = messages -%}
{%- endif -%}
{{- '<|im_start|>system\n' + system -}}
{%- if tools -%}
  {{- TOOLS_PREAMBLE -}}
  {%- for tool in tools -%}
    {{- '\n' -}}{{- (tool.function if tool.function is defined else tool) | tojson -}}
  {%- endfor -%}
  {{- TOOLS_INSTRUCTION -}}
{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- for message in rest -%}
  {%- if message.role == 'assistant' -%}
    {#- vLLM may pass content as a list of parts: test the rendered text, not the list. -#}
    {%- set content = text(message.content) | string -%}
    {{- '<|im_start|>assistant\n' + content -}}
    {%- for call in (message.tool_calls or []) -%}
      {%- set fn = call.function if call.function is defined else call -%}
      {%- if content or not loop.first -%}{{- '\n' -}}{%- endif -%}
      {{- '<tool_call>\n{"name": "' + fn.name + '", "arguments": ' -}}
      {%- if fn.arguments is string -%}{{- fn.arguments -}}
      {%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}
      {{- '}\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\n' -}}
  {%- elif message.role == 'tool' -%}
    {{- '<|im_start|>user\n<tool_response>\n' + text(message.content) -}}
    {{- '\n</tool_response><|im_end|>\n' -}}
  {%- else -%}
    {{- '<|im_start|>' + message.role + '\n' + text(message.content) -}}
    {{- '<|im_end|>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""
)


def jinja_literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


TOOL_CHAT_TEMPLATE = (
    _TEMPLATE.strip()
    .replace("DEFAULT_SYSTEM", jinja_literal(_DEFAULT_SYSTEM))
    .replace("TOOLS_PREAMBLE", jinja_literal(_TOOLS_PREAMBLE))
    .replace("TOOLS_INSTRUCTION", jinja_literal(_TOOLS_INSTRUCTION))
)
"""The template text (Jinja), as written into the converted model's folder."""

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Split a completion into its free text and OpenAI-shaped `tool_calls`.

    A `<tool_call>` block whose body is not a JSON object with a string `name` is left
    in the text (the model wrote something, just not a call): the reward function sees
    it, nothing is dropped.
    """
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    cursor = 0
    for match in _TOOL_CALL.finditer(text):
        try:
            body = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            continue
        arguments = body.get("arguments", body.get("parameters", {}))
        kept.append(text[cursor : match.start()])
        cursor = match.end()
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": body["name"],
                    "arguments": arguments
                    if isinstance(arguments, str)
                    else json.dumps(arguments, ensure_ascii=False),
                },
            }
        )
    kept.append(text[cursor:])
    content = "".join(kept).strip()
    return (content or None), calls


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` as vLLM hands them to a chat template: tool-call arguments as objects.

    OpenAI messages carry arguments as JSON strings; templates that write calls in another
    syntax (Gemma's Python-style lists) need the object, so every renderer outside vLLM
    (SFT, tests) must pass what vLLM passes or its token ids will differ.
    """
    converted = []
    for message in messages:
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if not calls:
            converted.append(message)
            continue
        fixed = []
        for call in calls:
            function = dict(call.get("function") or {})
            if isinstance(function.get("arguments"), str):
                try:
                    function["arguments"] = json.loads(function["arguments"] or "{}")
                except json.JSONDecodeError:
                    function["arguments"] = {}  # what vLLM does with a malformed string
            fixed.append({**call, "function": function})
        converted.append({**message, "tool_calls": fixed})
    return converted
