"""The grammar of a forced tool call: the model family's own call envelope around arguments
that fit the tool's schema.

`tool_choice="required"` promises at least one call and a named tool choice a call of that
tool, each with arguments that fit the tool's JSON schema. vLLM keeps neither promise for
every family: its own forced-call grammar for Hermes-style models constrains only the
envelope unless a tool is `strict` (0.32), and for other families it asks for a bare JSON
array the model was never shown. So the policy endpoint writes the grammar itself, as an
xgrammar structural tag (vLLM's `structured_outputs.structural_tag`, the same on vLLM
0.26 and 0.32, CPU and GPU), from what `families.py` knows about the envelope:

- `hermes` (SmolLM2 with rlcoach's template, Qwen3): `<tool_call>\\n{"name": "add",
  "arguments": {...}}\\n</tool_call>`, several calls one per line;
- `pythonic` (Gemma 3): `[add(a=2, b=3)]`, several calls in the one list; top-level
  booleans and null are written as Python's `True`/`False`/`None`, as the chat template
  renders them, nested values as JSON;
- `llama3_json` (Llama 3): `{"name": "add", "parameters": {...}}`, several separated by `; `.

Argument values follow the tool's schema (xgrammar's JSON-schema grammar: properties in
the schema's order, required ones present, no others), with at most one whitespace
character in a row: the model's `{"a": 2, "b": 3}` is allowed, a run of blank lines is
not (a small model can spend its whole budget on those). After the last call only the
end of turn is allowed. What could run on (strings, arrays, numbers) is bounded from the
reply's token budget so that the calls close within it (call_budget.py, `plan`).

`strict` tools without a forced choice (Hermes and Llama 3 JSON envelopes) get a
triggered grammar: free text until the envelope opens, then a call held to its schema.

The engine is asked with `tool_choice="none"`, so vLLM adds no grammar of its own and
renders the same prompt (tools are still shown); the endpoint reads the calls out of the
sampled text (`tool_calls`) and answers as OpenAI does. The text is exactly what was
sampled, so a returned call re-renders to the sampled tokens: the argument strings are
cut from the text as written, not re-serialised.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from rlcoach.endpoint.call_budget import MAX_SIZE, bounded_schema, worst_bytes
from rlcoach.endpoint.constraint import GUIDED_KINDS, STRUCTURED_KINDS
from rlcoach.endpoint.schema_support import check_tool_schema
from rlcoach.engines.stream import CompletionAssembler
from rlcoach.errors import ToolSchemaError

__all__ = ["ENVELOPES", "TRIGGERS", "ForcedCall", "as_calls", "forced_call", "with_tool_calls"]

ENVELOPES = ("hermes", "pythonic", "llama3_json")
"""The vLLM tool-call parsers whose envelope the endpoint can write a grammar for."""

MAX_CALLS = 8
"""The most calls one forced reply may make (fewer where the budget holds fewer)."""
ROOMY = 16
"""A reply may make several calls only where each still has this much room (`k`)."""

_MAX_WHITESPACE = 1
_CALL_HEAD = re.compile(r'\{"name": "((?:[^"\\]|\\.)*)", "(?:arguments|parameters)": ')
_EMPTY_OBJECT = {"type": "object", "properties": {}}
_OPEN_OBJECT = {"type": "object"}
TRIGGERS = {"hermes": "<tool_call>", "llama3_json": '{"name": '}
"""Where a call opens in free text, for the envelopes whose opening free text does not
hold by chance (a pythonic call opens with `[`, which prose uses): `strict` tools
without a forced choice get a triggered grammar for these."""


@dataclass(frozen=True, slots=True)
class ForcedCall:
    """A request whose reply must be tool calls: which tools, in which envelope."""

    envelope: str
    tools: tuple[tuple[str, dict[str, Any]], ...]
    """(name, parameters schema) of each tool the reply may call."""
    named: str | None
    """The tool a named tool choice forces (None for `required`)."""
    single: bool
    """One call only (a named choice, or `parallel_tool_calls=false`)."""

    budget: int | None = None
    """The reply's token budget (`max_tokens`, else the context's room): what runs on
    is bounded so that the calls fit it (call_budget.py). None: unbounded."""
    auto: bool = False
    """`strict` tools without a forced choice: free text, or calls held to the schema
    once the envelope opens (a triggered grammar)."""

    def _envelope(self) -> tuple[str, str, str, str, str]:
        """(begin with `{name}`, end, separator, before the calls, after them)."""
        if self.envelope == "hermes":
            begin = '<tool_call>\n{"name": "{name}", "arguments": '
            return begin, "}\n</tool_call>", "\n", "", ""
        if self.envelope == "llama3_json":
            return '{"name": "{name}", "parameters": ', "}", "; ", "", ""
        return "{name}(", ")", ", ", "[", "]"

    def plan(self) -> tuple[dict[str, int] | None, int | None]:
        """(the free-value size `k` of each tool the reply may call, most calls) for the
        budget: as many calls as fit with every tool's `k` at least `ROOMY` (one per tool
        offered, at most `MAX_CALLS`), each call as large as fits its share; one call when
        even that does not. A tool whose shortest call does not fit is left out when
        another fits (a reply must close); when none fits, all stay at `k` 0 and the reply
        may be cut (`closes` is False). (None, None): no budget, no bounds."""
        if self.budget is None:
            return None, None
        begin, end, separator, before, after = self._envelope()
        room = self.budget - 1 - _bytes(before + after)  # 1: the end of turn
        most = 1 if self.single else min(len(self.tools), MAX_CALLS)

        def sizes_for(calls: int) -> dict[str, int]:
            share = (room - (calls - 1) * _bytes(separator)) // calls
            return {
                name: _largest(_bytes(begin.replace("{name}", name) + end), schema, share)
                for name, schema in self.tools
            }

        alone = {name: k for name, k in sizes_for(1).items() if k >= 0}
        if alone:  # the tools a reply of one call can make; several where each keeps room
            for calls in range(most, 1, -1):
                shared = sizes_for(calls)
                if all(shared[name] >= ROOMY for name in alone):
                    return {name: shared[name] for name in alone}, calls
            return alone, 1
        return {name: 0 for name, _ in self.tools}, 1

    @property
    def closes(self) -> bool:
        """Whether every reply the grammar allows ends within the budget."""
        sizes, _ = self.plan()
        return sizes is None or self._fits_shortest(sizes)

    def _fits_shortest(self, sizes: dict[str, int]) -> bool:
        begin, end, _, before, after = self._envelope()
        room = (self.budget or 0) - 1 - _bytes(before + after)
        return any(
            _largest(_bytes(begin.replace("{name}", name) + end), schema, room) >= 0
            for name, schema in self.tools
            if name in sizes
        )

    def structural_tag(self) -> dict[str, Any]:
        """The grammar, as an xgrammar structural tag (a JSON-able dict)."""
        begin, end, separator, before, after = self._envelope()
        sizes, most = self.plan()
        tags = []
        for name, schema in self.tools:
            if sizes is not None and name not in sizes:
                continue  # its shortest call does not fit the budget
            held = schema if sizes is None else bounded_schema(schema, sizes[name])
            content = _kwargs(name, held) if self.envelope == "pythonic" else _json(held)
            tags.append(
                {
                    "type": "tag",
                    "begin": begin.replace("{name}", name),
                    "content": content,
                    "end": end,
                }
            )
        if self.auto:
            calls: dict[str, Any] = {
                "type": "triggered_tags",
                "triggers": [_trigger(self.envelope)],
                "tags": tags,
                "stop_after_first": self.single,
            }
            return {"type": "structural_tag", "format": calls}
        one = tags[0] if len(tags) == 1 else {"type": "or", "elements": tags}
        if most is None and not self.single:
            calls = {
                "type": "tags_with_separator",
                "tags": tags,
                "separator": separator,
                "at_least_one": True,
            }
        elif most is not None and most > 1:
            calls = one  # up to `most` calls, as nested optional ones
            for _ in range(most - 1):
                more = {"type": "sequence", "elements": [_const(separator), calls]}
                calls = {
                    "type": "sequence",
                    "elements": [one, {"type": "optional", "content": more}],
                }
        else:
            calls = one
        if before or after:
            calls = {"type": "sequence", "elements": [_const(before), calls, _const(after)]}
        return {"type": "structural_tag", "format": calls}

    def conflict(self, body: dict[str, Any]) -> str | None:
        """Why `body` cannot be sampled under this grammar (None: it can): the engine holds
        a reply to one grammar, so a constraint of the request's own (vLLM's
        `structured_outputs` or `guided_*`; a JSON `response_format` where the reply may be
        text) cannot come with it. A forced reply is calls only, so its `response_format`,
        which governs text, is moot and dropped."""
        structured = body.get("structured_outputs")
        structured = structured if isinstance(structured, dict) else {}
        own = [
            f"structured_outputs.{kind}"
            for kind in STRUCTURED_KINDS
            if structured.get(kind) not in (None, False)
        ]
        own += [f"guided_{kind}" for kind in GUIDED_KINDS if body.get(f"guided_{kind}") is not None]
        response_format = body.get("response_format") or {}
        declared = response_format.get("type") if isinstance(response_format, dict) else None
        if self.auto and declared in ("json_schema", "json_object"):
            own.append(f"response_format {declared}")
        if not own:
            return None
        mine = (
            "strict tools"
            if self.auto
            else f"tool_choice {self.named!r}"
            if self.named
            else "tool_choice='required'"
        )
        return (
            f"the request asks for two sampling constraints, {mine} (the endpoint's grammar "
            f"for the call) and {', '.join(own)}; the engine holds a reply to one grammar; "
            f"fix: drop {own[0]}, or the {mine}"
        )

    def upstream(self, body: dict[str, Any]) -> dict[str, Any]:
        """The engine's request body: the grammar, and no tool choice for vLLM to act on."""
        upstream = {k: v for k, v in body.items() if k not in ("response_format",)}
        upstream["tool_choice"] = "none"
        structured = dict(body.get("structured_outputs") or {})  # its options, if any
        structured["structural_tag"] = json.dumps(self.structural_tag())
        upstream["structured_outputs"] = structured
        return upstream

    def tool_calls(self, text: str) -> list[dict[str, Any]]:
        """The OpenAI `tool_calls` in a reply sampled under this grammar: every complete
        call (a reply cut by `max_tokens` in its second call still made its first; empty
        when it was cut before one call was complete)."""
        found = _pythonic_calls(text) if self.envelope == "pythonic" else _json_calls(text)
        names = {name for name, _ in self.tools}
        return [
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            for name, arguments in found
            if name in names
        ]

    def finish_reason(self, sampled: str | None) -> str | None:
        """OpenAI's finish reason for a reply that ended with calls: `tool_calls`, but
        `stop` for a named tool choice; a cut reply keeps `length`."""
        if sampled != "stop":
            return sampled
        return "stop" if self.named else "tool_calls"


def forced_call(
    body: dict[str, Any], parser: str | None, budget: int | None = None
) -> ForcedCall | None:
    """The forced call a request asks for (`tool_choice` required or a named tool; or
    `strict` tools the model may call), when the engine's tool-call parser is one whose
    envelope the endpoint writes; None for a free request. `budget` is the reply's token
    budget (call_budget.py). Raises `ToolSchemaError` for a schema the grammar cannot
    hold."""
    offered = body.get("tools")
    tools = [
        t
        for t in (offered if isinstance(offered, list) else [])
        if isinstance(t, dict) and isinstance(t.get("function"), dict)
    ]
    choice = body.get("tool_choice")
    if parser not in ENVELOPES or not tools:
        return None
    auto = False
    if isinstance(choice, dict):
        named = (choice.get("function") or {}).get("name")
    elif choice == "required":
        named = None
    elif choice in (None, "auto") and parser in TRIGGERS and any(map(_strict, tools)):
        named, auto = None, True
    else:
        return None
    callable_tools = []
    for tool in tools:
        function = tool["function"]
        name = function.get("name")
        if not isinstance(name, str) or (named is not None and name != named):
            continue
        schema = function.get("parameters") or _EMPTY_OBJECT
        if auto and not _strict(tool):
            schema = _OPEN_OBJECT  # not `strict`: any arguments (the call still parses)
        check_tool_schema(name, schema)
        callable_tools.append((name, schema))
    if not callable_tools:
        return None
    single = named is not None or body.get("parallel_tool_calls") is False
    return ForcedCall(parser, tuple(callable_tools), named, single, budget, auto)


def _strict(tool: dict[str, Any]) -> bool:
    return bool(tool.get("strict") or tool["function"].get("strict"))


def as_calls(
    chunk: dict[str, Any],
    forced: ForcedCall,
    assembler: CompletionAssembler,
    made: dict[int, list[dict[str, Any]]],
) -> dict[str, Any]:
    """A stream chunk of a forced call as the client gets it: the envelope's text is held
    back, and the choice's last chunk carries its calls whole (or, for a reply cut before a
    call was complete, the text held back)."""
    parts = []
    for part in chunk.get("choices") or []:
        delta = {k: v for k, v in (part.get("delta") or {}).items() if k != "content"}
        if part.get("finish_reason"):
            index = int(part.get("index", 0))
            text = assembler.text(index)
            made[index] = calls = forced.tool_calls(text)
            if calls:
                delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(calls)]
                if forced.auto and (before := text.split(TRIGGERS[forced.envelope])[0].strip()):
                    delta["content"] = before
                part = {**part, "finish_reason": forced.finish_reason(part["finish_reason"])}
            else:
                delta["content"] = text
        parts.append({**part, "delta": delta})
    return {**chunk, "choices": parts}


def with_tool_calls(
    choice: dict[str, Any], forced: ForcedCall, calls: list[dict[str, Any]]
) -> dict[str, Any]:
    """A completion choice answered as tool calls (unchanged when there are none: a
    reply cut by `max_tokens` keeps its text and `finish_reason="length"`)."""
    if not calls:
        return choice
    message = dict(choice.get("message") or {})
    text = message.get("content")
    # free text before a call the model chose to make stays the reply's content
    before = text.split(TRIGGERS[forced.envelope])[0].strip() if forced.auto and text else ""
    message.update(content=before or None, tool_calls=calls)
    finish = forced.finish_reason(choice.get("finish_reason"))
    return {**choice, "message": message, "finish_reason": finish}


# -- grammar pieces -------------------------------------------------------------------------


def _largest(fixed: int, schema: Any, room: int) -> int:
    """The largest free-value size `k` whose call (`fixed` bytes of envelope around the
    arguments) fits `room` bytes; -1 where none does."""
    if fixed + worst_bytes(bounded_schema(schema, 0), 0) > room:
        return -1
    low, high = 0, MAX_SIZE  # a call's worst case grows with k
    while low < high:
        middle = (low + high + 1) // 2
        fits = fixed + worst_bytes(bounded_schema(schema, middle), middle) <= room
        low, high = (middle, high) if fits else (low, middle - 1)
    return low


def _bytes(text: str) -> int:
    return len(text.encode())


def _trigger(envelope: str) -> str:
    return TRIGGERS[envelope]


def _const(text: str) -> dict[str, Any]:
    return {"type": "const_string", "value": text}


def _json(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": _MAX_WHITESPACE}


def _kwargs(tool: str, schema: dict[str, Any]) -> dict[str, Any]:
    """Python keyword arguments for an object schema: required ones in order, then the
    optional ones, each at most once (the pythonic envelope)."""
    properties = schema.get("properties") or {}
    required = [n for n in properties if n in set(schema.get("required") or [])]
    optional = [n for n in properties if n not in required]
    for name in properties:
        if not name.isidentifier():
            raise ToolSchemaError(
                tool,
                "properties",
                f"#/properties/{name}",
                "a Python-style tool call (this model family's) can only pass arguments "
                "whose names are identifiers",
            )
    defs: dict[str, Any] = {k: schema[k] for k in ("$defs", "definitions") if k in schema}

    def argument(name: str, separator: str) -> list[dict[str, Any]]:
        return [_const(f"{separator}{name}="), _value({**properties[name], **defs})]

    elements: list[dict[str, Any]] = []
    for index, name in enumerate(required):
        elements += argument(name, ", " if index else "")
    if required:
        elements += [
            {"type": "optional", "content": _sequence(argument(name, ", "))} for name in optional
        ]
    elif optional:
        # No required argument: which optional one comes first decides the separators.
        firsts = [
            _sequence(
                argument(name, "")
                + [
                    {"type": "optional", "content": _sequence(argument(later, ", "))}
                    for later in optional[index + 1 :]
                ]
            )
            for index, name in enumerate(optional)
        ]
        elements.append({"type": "optional", "content": {"type": "or", "elements": firsts}})
    if not elements:
        return _const("")
    return _sequence(elements)


def _sequence(elements: list[dict[str, Any]]) -> dict[str, Any]:
    return elements[0] if len(elements) == 1 else {"type": "sequence", "elements": elements}


def _value(schema: dict[str, Any]) -> dict[str, Any]:
    """One keyword argument's value: Python literals for a top-level boolean or null (as
    the chat template renders them), JSON for everything else."""
    kind = schema.get("type")
    if kind == "boolean" and "enum" not in schema and "const" not in schema:
        return {"type": "or", "elements": [_const("True"), _const("False")]}
    if kind == "null":
        return _const("None")
    return _json(schema)


# -- reading the calls back -----------------------------------------------------------------


def _json_calls(text: str) -> list[tuple[str, str]]:
    """(name, arguments as written) of each complete `{"name": ..., "arguments": {...}}`
    call."""
    decoder = json.JSONDecoder()
    found = []
    for head in _CALL_HEAD.finditer(text):
        start = head.end()
        try:
            _, end = decoder.raw_decode(text, start)
        except ValueError:
            break  # cut inside this call's arguments
        if not text.startswith("}", end):
            break  # cut before the call's object closed
        found.append((json.loads(f'"{head.group(1)}"'), text[start:end]))
    return found


_LITERAL_NAMES = {
    "True": True,
    "False": False,
    "None": None,
    "true": True,
    "false": False,
    "null": None,
}


def _pythonic_calls(text: str) -> list[tuple[str, str]]:
    """(name, arguments as JSON) of each complete call in a `[name(key=value, ...), ...]`
    list (one cut short is closed after its last complete call)."""
    text = text.strip()
    for end in [len(text), *(i + 1 for i in range(len(text) - 1, 0, -1) if text[i] == ")")]:
        candidate = text[:end] if end == len(text) else text[:end] + "]"
        try:
            return _pythonic_list(candidate)
        except (SyntaxError, ValueError):
            continue
    return []


def _pythonic_list(text: str) -> list[tuple[str, str]]:
    tree = ast.parse(text, mode="eval").body
    if not isinstance(tree, ast.List):
        raise ValueError("not a list of calls")
    found = []
    for call in tree.elts:
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
            raise ValueError("not a call")
        arguments = {k.arg: _literal(k.value) for k in call.keywords if k.arg is not None}
        found.append((call.func.id, json.dumps(arguments, ensure_ascii=False)))
    return found


def _literal(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in _LITERAL_NAMES:
        return _LITERAL_NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_literal(node.operand)
    if isinstance(node, ast.List):
        return [_literal(item) for item in node.elts]
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values, strict=True) if k}
    raise ValueError(f"not a literal: {ast.dump(node)[:80]}")
