"""Which JSON schemas a sampling grammar can enforce, checked before anything is sampled.

A forced tool call promises arguments that fit the tool's schema (call_grammar.py), and
that promise is only as good as the grammar engine's reading of the schema. xgrammar
(vLLM's grammar engine) compiles most of JSON Schema, but it silently ignores some
keywords (`not`, `if`/`then`/`else`, `uniqueItems`, `multipleOf`, ...): the grammar it
builds then allows values the schema forbids, and the reply would break the promise. A
`$ref` that points nowhere fails inside the engine, and a recursive `$ref` can ask for an
unbounded value. So the policy endpoint refuses such a tool with a 400 that names the tool,
the keyword and where it sits, before sampling — instead of sampling a reply that does not
fit, or failing inside the engine with a message that names neither.
"""

from __future__ import annotations

from typing import Any

from rlcoach.errors import ToolSchemaError

__all__ = ["UNENFORCED_KEYWORDS", "check_tool_schema"]

UNENFORCED_KEYWORDS = frozenset(
    {
        "not",
        "if",
        "then",
        "else",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
        "multipleOf",
        "unevaluatedProperties",
        "unevaluatedItems",
        "patternProperties",
        "$dynamicRef",
        "$recursiveRef",
    }
)
"""Keywords xgrammar 0.2 accepts but does not enforce (checked here: a grammar compiled
with them lets through values they forbid)."""

_FORMATS = frozenset(
    {
        "date",
        "date-time",
        "duration",
        "email",
        "hostname",
        "ipv4",
        "ipv6",
        "json-pointer",
        "relative-json-pointer",
        "time",
        "uri",
        "uri-reference",
        "uri-template",
        "uuid",
    }
)
"""String formats the grammar enforces (vLLM's list for xgrammar)."""

# Keywords whose value is a map of names to schemas, or a list of schemas, or one schema.
_SCHEMA_MAPS = ("properties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_VALUES = ("items", "additionalProperties", "propertyNames")


def check_tool_schema(tool: str, schema: Any) -> None:
    """Raise `ToolSchemaError` when the grammar engine cannot enforce `schema`, the
    parameters of tool `tool` (the message names the tool, the keyword and its path)."""
    if schema is None or isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise ToolSchemaError(
            tool, "parameters", "#", f"it must be a JSON schema object, got {schema!r:.60}"
        )
    _walk(tool, schema, schema, "#", ())


def _walk(tool: str, root: dict[str, Any], node: Any, path: str, refs: tuple[str, ...]) -> None:
    if not isinstance(node, dict):
        return
    for keyword in node:
        if keyword in UNENFORCED_KEYWORDS:
            raise ToolSchemaError(
                tool, keyword, path, "the grammar engine (xgrammar) does not enforce it"
            )
    if node.get("format") is not None and node["format"] not in _FORMATS:
        raise ToolSchemaError(
            tool,
            "format",
            path,
            f"format {node['format']!r} is not one the grammar engine enforces "
            f"({', '.join(sorted(_FORMATS))})",
        )
    ref = node.get("$ref")
    if ref is not None:
        if ref in refs or ref == "#":
            raise ToolSchemaError(
                tool,
                "$ref",
                path,
                f"{ref!r} refers back to a schema that contains it (a recursive $ref)",
            )
        target = _resolve(root, ref)
        if target is None:
            raise ToolSchemaError(tool, "$ref", path, f"{ref!r} points to no schema here")
        _walk(tool, root, target, ref, (*refs, ref))
    for keyword in _SCHEMA_MAPS:
        children = node.get(keyword)
        if isinstance(children, dict) and keyword == "properties":
            for name, child in children.items():
                _walk(tool, root, child, f"{path}/properties/{name}", refs)
    for keyword in _SCHEMA_LISTS:
        children = node.get(keyword)
        if isinstance(children, list):
            for index, child in enumerate(children):
                _walk(tool, root, child, f"{path}/{keyword}/{index}", refs)
    for keyword in _SCHEMA_VALUES:
        _walk(tool, root, node.get(keyword), f"{path}/{keyword}", refs)


def _resolve(root: dict[str, Any], ref: str) -> dict[str, Any] | None:
    """The schema a local `$ref` (`#/$defs/Name`) points to, or None."""
    if not ref.startswith("#/"):
        return None
    node: Any = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node if isinstance(node, dict) else None
