"""Bounds that make a forced tool call close within the reply's token budget.

A grammar holds a call's arguments to the tool's schema, but JSON lets some values run
on: a string without `maxLength`, an array without `maxItems`, an integer or number
without bounds, an object that takes further properties. A model may keep writing such a
value until `max_tokens` cuts the call, and then there is no call at all. So the policy
endpoint bounds every such value before it builds the grammar (call_grammar.py), from the
request's token budget (`max_tokens`, else the room the engine's context leaves after
the prompt), so that the whole reply — the family's envelope, every key the schema
requires, every optional one, each value at its longest — fits the budget:

- the bounds are worst cases in bytes, and every sampled token is at least one byte of
  text, so a reply held to them ends with the end of turn before the budget is spent;
- a bound the schema sets itself is kept when it is tighter; one the schema needs (a
  `minLength`, `minItems`) is never cut below;
- a tool's free values share one size `k`, the largest with which its call fits the
  budget (its share, where a reply may make several calls; at most `MAX_SIZE`): a
  string holds at most `k` characters (up to 4 bytes each), an array `k // 4` items (at
  least one), an integer up to `min(k, 15)` digits, a number the same with up to 6
  decimals (xgrammar's bounded number), an open object `k // 8` further properties
  whose names hold `k` characters;
- a value the schema leaves open (no `type`) is held to a JSON scalar or a flat list or
  object of scalars.

What a bounded string cannot hold: xgrammar bounds a string's length only without
escapes, so its text has no `"`, `\\`, newline or other control character (held out by a
`pattern`: its `maxLength` lets raw control characters through, which JSON forbids). A
string `format` that is open-ended (`email`, `uri`, `hostname`, ...) or the schema's own
`pattern` is not bounded here: it is counted at `k` characters, and a model that writes
it longer can still be cut (`finish_reason="length"`, as any cut reply).

A tool whose shortest call does not fit the budget is left out of a `required` choice
when another fits; a named tool that does not fit is sampled anyway and cut.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_SIZE", "bounded_schema", "worst_bytes"]

MAX_SIZE = 2048
"""The largest free-value size `k` (characters of a string): the grammar of a string this
long takes xgrammar about 9 s to compile here (235 characters: 0.9 s; vLLM keeps a
compiled grammar for the next request that asks for the same), a longer one more."""

_BYTES_PER_CHAR = 4  # UTF-8
_CHAR = '[^\\x00-\\x1f"\\\\]'  # a character a bounded string may hold
_REPEAT = 128
"""The longest repetition one regex quantifier may ask of xgrammar: 0.2.8 (vLLM 0.32's)
fails to compile a larger one with its cache on, as vLLM runs it ("per_rule_fsm_hashes":
`[a-z]{0,129}` fails, `{0,128}` compiles), so a longer bound is written in pieces."""
_MAX_DIGITS = 15
_DECIMALS = 6  # xgrammar writes a number with minimum/maximum with at most 6 decimals
_WHITESPACE = 1  # at most one whitespace character in a row (call_grammar.py)
_FORMAT_BYTES = {
    "date": 10,
    "time": 32,
    "date-time": 40,
    "uuid": 36,
    "ipv4": 15,
    "ipv6": 45,
}


def bounded_schema(schema: Any, k: int, root: Any = None) -> Any:
    """`schema` with every value that could run on bounded by size `k`, local `$ref`s
    inlined (the schema was checked: no recursive or dangling one)."""
    root = schema if root is None else root
    if isinstance(schema, bool) or not isinstance(schema, dict):
        return _any(k) if schema is True or schema is None else schema
    ref = schema.get("$ref")
    if isinstance(ref, str):
        target = _resolve(root, ref)
        rest = {key: v for key, v in schema.items() if key != "$ref"}
        return bounded_schema({**target, **rest}, k, root)
    out = {key: v for key, v in schema.items() if key not in ("$defs", "definitions")}
    for keyword in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(keyword), list):
            out[keyword] = [bounded_schema(s, k, root) for s in schema[keyword]]
    if "enum" in schema or "const" in schema or any(w in out for w in ("anyOf", "oneOf")):
        return out
    if "allOf" in out:
        return out
    kind = schema.get("type")
    if isinstance(kind, list):
        branches = [{**out, "type": t} for t in kind]
        return {"anyOf": [bounded_schema(b, k, root) for b in branches]}
    if kind is None:
        return {**out, **_any(k)} if not _has_shape(schema) else _shaped(out, k, root)
    return _typed(out, kind, k, root)


def _has_shape(schema: dict[str, Any]) -> bool:
    return any(w in schema for w in ("properties", "items", "prefixItems"))


def _shaped(schema: dict[str, Any], k: int, root: Any) -> dict[str, Any]:
    kind = "object" if "properties" in schema else "array"
    return _typed({**schema, "type": kind}, kind, k, root)


def _typed(schema: dict[str, Any], kind: str, k: int, root: Any) -> dict[str, Any]:
    if kind == "string":
        if "format" in schema or "pattern" in schema:
            return schema
        shortest = int(schema.get("minLength", 0))
        longest = min(int(schema.get("maxLength", max(shortest, k))), max(shortest, k))
        return {**schema, **_string(shortest, longest)}
    if kind in ("integer", "number"):
        digits = max(1, min(k, _MAX_DIGITS))
        edge = 10**digits - 1
        out = dict(schema)
        if "minimum" not in schema and "exclusiveMinimum" not in schema:
            out["minimum"] = -edge
        if "maximum" not in schema and "exclusiveMaximum" not in schema:
            out["maximum"] = edge
        return out
    if kind == "array":
        out = dict(schema)
        items = max(int(schema.get("minItems", 0)), max(1, k // 4))
        out["maxItems"] = min(int(schema.get("maxItems", items)), items)
        if isinstance(schema.get("prefixItems"), list):
            out["prefixItems"] = [bounded_schema(s, k, root) for s in schema["prefixItems"]]
        if schema.get("items") is not False:
            out["items"] = bounded_schema(schema.get("items", True), k, root)
        return out
    if kind == "object":
        return _object(schema, k, root)
    return schema


def _object(schema: dict[str, Any], k: int, root: Any) -> dict[str, Any]:
    properties = schema.get("properties") or {}
    out = dict(schema)
    out["properties"] = {n: bounded_schema(s, k, root) for n, s in properties.items()}
    extra = schema.get("additionalProperties")
    # xgrammar takes no further properties when the schema lists some and says nothing
    if extra is False or (extra is None and properties):
        return out
    out["additionalProperties"] = bounded_schema(True if extra is None else extra, k, root)
    out["propertyNames"] = {"type": "string", **_string(0, k)}
    most = len(properties) + max(1, k // 8)
    out["maxProperties"] = min(int(schema.get("maxProperties", most)), most)
    return out


def _any(k: int) -> dict[str, Any]:
    """A value the schema leaves open: a scalar, or a flat list or object of scalars."""
    scalars = [
        {"type": "string", **_string(0, k)},
        {"type": "number", "minimum": -(10 ** max(1, min(k, _MAX_DIGITS)) - 1)},
        {"type": "boolean"},
        {"type": "null"},
    ]
    scalars[1]["maximum"] = -scalars[1]["minimum"]
    flat = {"anyOf": scalars}
    items = max(1, k // 4)
    return {
        "anyOf": [
            *scalars,
            {"type": "array", "items": flat, "maxItems": items},
            {
                "type": "object",
                "additionalProperties": flat,
                "propertyNames": {"type": "string", **_string(0, k)},
                "maxProperties": items,
            },
        ]
    }


def _string(shortest: int, longest: int) -> dict[str, Any]:
    """A string of `shortest` to `longest` characters, none of them a control character,
    `"` or `\\`, as a `pattern` (xgrammar's `maxLength` lets control characters through,
    which JSON forbids; its `pattern` holds them out). `maxLength` (and `minLength`) say
    the same for readers; xgrammar goes by the pattern."""
    lengths = {"minLength": shortest} if shortest else {}
    return {"pattern": _string_pattern(shortest, longest), **lengths, "maxLength": longest}


def _string_pattern(shortest: int, longest: int) -> str:
    """`^C{shortest,longest}$` for a character class C, with no quantifier above
    `_REPEAT`: `n` characters exactly as `(?:C{128}){q}C{r}`, and up to `n` as either
    fewer than 128q characters or 128q and up to r more (n = 128q + r): one reading of
    each length, so the grammar stays as small as the plain quantifier's."""

    def exactly(n: int) -> str:
        q, r = divmod(n, _REPEAT)
        return (f"(?:{_CHAR}{{{_REPEAT}}}){{{q}}}" if q else "") + (f"{_CHAR}{{{r}}}" if r else "")

    def up_to(n: int) -> str:
        if n <= _REPEAT:
            return f"{_CHAR}{{0,{n}}}"
        q, r = divmod(n, _REPEAT)
        fewer = (f"(?:{_CHAR}{{{_REPEAT}}}){{0,{q - 1}}}" if q > 1 else "") + (
            f"{_CHAR}{{0,{_REPEAT - 1}}}"
        )
        more = exactly(_REPEAT * q) + (f"{_CHAR}{{0,{r}}}" if r else "")
        return f"(?:{fewer}|{more})"

    if longest <= _REPEAT:
        return f"^{_CHAR}{{{shortest},{longest}}}$"
    return f"^{exactly(shortest)}{up_to(longest - shortest)}$"


def _string_bound(schema: dict[str, Any]) -> int | None:
    """The most characters of a string bounded here (by `_string`), else None."""
    longest, pattern = schema.get("maxLength"), schema.get("pattern")
    if "format" in schema or not isinstance(longest, int) or not isinstance(pattern, str):
        return None
    ours = pattern == _string_pattern(int(schema.get("minLength", 0)), longest)
    return longest if ours else None


def _resolve(root: Any, ref: str) -> dict[str, Any]:
    node = root
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


# -- the longest text a bounded schema allows --------------------------------------------


def worst_bytes(schema: Any, k: int) -> int:
    """The most bytes of JSON a value of the bounded `schema` can take (whitespace
    included: at most one character at each place JSON allows it)."""
    if not isinstance(schema, dict):
        return worst_bytes(_any(k), k) if schema is not False else 0
    if "const" in schema:
        return _literal_bytes(schema["const"])
    if "enum" in schema:
        return max((_literal_bytes(v) for v in schema["enum"]), default=0)
    if isinstance(schema.get("allOf"), list) and schema["allOf"]:
        return min(worst_bytes({**schema, **s, "allOf": None}, k) for s in schema["allOf"])
    branches = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(branches, list) and branches:
        return max(worst_bytes(s, k) for s in branches)
    kind = schema.get("type")
    if kind == "string":
        if (longest := _string_bound(schema)) is not None:
            return 2 + _BYTES_PER_CHAR * longest
        return 2 + _FORMAT_BYTES.get(schema.get("format", ""), _BYTES_PER_CHAR * k)
    if kind in ("integer", "number"):
        ends = [schema.get(w) for w in ("minimum", "maximum", "exclusiveMinimum")]
        ends.append(schema.get("exclusiveMaximum"))
        longest = max(len(str(int(v))) for v in ends if isinstance(v, (int, float)))
        return longest + (1 + _DECIMALS if kind == "number" else 0)
    if kind == "boolean":
        return 5
    if kind == "null":
        return 4
    if kind == "array":
        return _array_bytes(schema, k)
    if kind == "object":
        return _object_bytes(schema, k)
    return worst_bytes(_any(k), k)


def _array_bytes(schema: dict[str, Any], k: int) -> int:
    prefix = [worst_bytes(s, k) for s in schema.get("prefixItems") or []]
    items = schema.get("items", True)
    each = worst_bytes(items, k) if items is not False else 0
    count = int(schema.get("maxItems", len(prefix)))
    values = prefix[:count] + [each] * max(0, count - len(prefix))
    return _container(values)


def _object_bytes(schema: dict[str, Any], k: int) -> int:
    members = [
        _literal_bytes(name) + 1 + 2 * _WHITESPACE + worst_bytes(value, k)
        for name, value in (schema.get("properties") or {}).items()
    ]
    extra = schema.get("additionalProperties")
    if extra is not None and extra is not False:
        names = worst_bytes(schema.get("propertyNames") or {"type": "string"}, k)
        count = int(schema.get("maxProperties", len(members))) - len(members)
        members += [names + 1 + 2 * _WHITESPACE + worst_bytes(extra, k)] * max(0, count)
    return _container(members)


def _container(members: list[int]) -> int:
    """Brackets, each member and the commas between them, with whitespace around all."""
    separators = max(0, len(members) - 1) * (1 + 2 * _WHITESPACE)
    return 2 + 2 * _WHITESPACE + sum(members) + separators


def _literal_bytes(value: Any) -> int:
    """The longest a JSON literal can be written: with or without `\\u` escapes, and with
    whitespace at each place inside it that allows some."""
    text = json.dumps(value, ensure_ascii=False)
    longest = max(len(text.encode()), len(json.dumps(value)))
    if isinstance(value, (dict, list)):
        longest += 2 * _WHITESPACE * sum(text.count(c) for c in ",:[]{}")
    return longest
