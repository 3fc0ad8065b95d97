"""MCP tool descriptions as OpenAI tool schemas, and argument checks before a call.

MCP describes a tool's input with a JSON Schema; the policy is offered OpenAI function
tools. `convert_tools` keeps the schema's meaning (nested objects, arrays, enums,
required fields, defaults, descriptions, `anyOf`), and adapts what a policy cannot use:
local `$ref`s are inlined (recursive or external references are refused), `title`
keywords and `$schema`/`$id` are dropped (noise in a small model's context), a missing
schema becomes "no arguments", and names outside OpenAI's `[A-Za-z0-9_-]{1,64}` are
renamed (the original name is kept for the call). A tool that cannot be expressed is
skipped with the reason (`ToolSet.skipped`) rather than offered broken.

`ToolSet.check_call(name, arguments_json)` parses the policy's arguments and validates
them against the tool's schema (JSON Schema 2020-12 with `jsonschema`), so a call with
bad arguments is answered with the problem instead of reaching the server; a guarded
tool's SQL must also only read (`ToolSet.guards`, `sql_guard.py`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rlcoach.endpoint.schema_support import check_tool_schema
from rlcoach.errors import RLCoachError, ToolSchemaError
from rlcoach.integrations.mcp.sql_guard import read_only_sql_error
from rlcoach.trajectory.trajectories import Tool

__all__ = ["CallCheck", "SchemaError", "ToolSet", "convert_tools"]

OPENAI_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
DROPPED = {"title", "$schema", "$id", "$comment"}


class SchemaError(RLCoachError, ValueError):
    """A tool's input schema cannot be offered to the policy (the reason names the fix)."""


def _function_parts(tool: Any) -> tuple[str, str, dict[str, Any] | None]:
    """(name, description, input schema) of an MCP `Tool`, MCP dict or OpenAI tool."""
    if hasattr(tool, "model_dump"):
        data = tool.model_dump(by_alias=True)
    elif isinstance(tool, dict):
        data = tool
    else:
        raise SchemaError(
            f"{tool!r} is not a tool description; fix: pass an MCP Tool, or a dict as MCP "
            "or OpenAI describe a tool"
        )
    data = data.get("function", data)
    schema = data.get("parameters", data.get("inputSchema", data.get("input_schema")))
    return str(data.get("name") or ""), str(data.get("description") or ""), schema


def _resolve(ref: str, root: dict[str, Any]) -> dict[str, Any]:
    if not ref.startswith("#/"):
        raise SchemaError(
            f"the reference {ref!r} points outside the schema; only local "
            "references (#/$defs/...) can be inlined"
        )
    node: Any = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            raise SchemaError(
                f"the reference {ref!r} does not resolve inside the schema; fix: the "
                "server's schema must define what it references (under $defs)"
            )
        node = node[part]
    if not isinstance(node, dict):
        raise SchemaError(
            f"the reference {ref!r} is not a schema object; fix: point it at a schema "
            "(a JSON object) in the server's schema"
        )
    return node


def _inline(node: Any, root: dict[str, Any], seen: tuple[str, ...], keyword: bool) -> Any:
    """A copy of `node` with local `$ref`s replaced and noise keywords dropped.

    `keyword` is True where `node`'s keys are schema keywords (not property names).
    """
    if isinstance(node, list):
        return [_inline(item, root, seen, True) for item in node]
    if not isinstance(node, dict):
        return node
    if keyword and "$ref" in node:
        ref = node["$ref"]
        if ref in seen:
            raise SchemaError(
                f"the schema is recursive through {ref!r}; a recursive input "
                "cannot be spelled out for the policy"
            )
        target = _inline(_resolve(ref, root), root, (*seen, ref), True)
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        return {**target, **_inline(siblings, root, seen, True)}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if keyword and (
            (key in DROPPED and not isinstance(value, dict)) or key in ("$defs", "definitions")
        ):
            continue
        # Under these keywords the keys are names, and each value is a schema.
        names = keyword and key in ("properties", "patternProperties", "dependentSchemas")
        if names and isinstance(value, dict):
            out[key] = {name: _inline(sub, root, seen, True) for name, sub in value.items()}
        else:
            out[key] = _inline(
                value, root, seen, keyword and key not in ("enum", "const", "default", "examples")
            )
    return out


def convert_schema(schema: dict[str, Any] | None) -> dict[str, Any]:
    """An MCP input schema as OpenAI `parameters` (see the module docstring)."""
    if schema is None or schema == {}:
        return {"type": "object", "properties": {}}
    if not isinstance(schema, dict):
        raise SchemaError(
            f"the input schema is a {type(schema).__name__}, not a JSON object; fix: the "
            'server must describe the arguments as {"type": "object", ...}'
        )
    converted = _inline(schema, schema, (), True)
    kind = converted.get("type", "object" if "properties" in converted else None)
    if kind != "object":
        raise SchemaError(
            f"the input schema has type {kind!r}; tool arguments are a JSON "
            'object, so the schema must be {"type": "object", ...}'
        )
    converted["type"] = "object"
    converted.setdefault("properties", {})
    missing = [n for n in converted.get("required", []) if n not in converted["properties"]]
    if missing:
        raise SchemaError(
            f"required argument(s) {missing} have no entry in `properties`; fix: the "
            "server's schema must describe every required argument"
        )
    return converted


def _openai_name(name: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:60] or "tool"
    candidate, number = base, 2
    while candidate in taken:
        candidate, number = f"{base}_{number}", number + 1
    return candidate


@dataclass(frozen=True, slots=True)
class CallCheck:
    """A policy's tool call after checking: the server-side name and arguments, or why not."""

    name: str
    arguments: dict[str, Any] | None
    error: str | None


@dataclass
class ToolSet:
    """The tools offered to the policy, with what is needed to check and route calls."""

    tools: list[Tool] = field(default_factory=list)
    """OpenAI tool schemas, in the server's order."""
    server_names: dict[str, str] = field(default_factory=dict)
    """OpenAI name -> the server's tool name (they differ only for renamed tools)."""
    schemas: dict[str, dict[str, Any]] = field(default_factory=dict)
    """OpenAI name -> the converted input schema the arguments are checked against."""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(tool name, reason) for tools that could not be offered."""
    renamed: list[tuple[str, str]] = field(default_factory=list)
    guards: dict[str, str] = field(default_factory=dict)
    """OpenAI name -> the property whose SQL must only read (`sql_guard.py`)."""

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    def add(
        self,
        name: str,
        description: str,
        parameters: dict[str, Any],
        server_name: str | None = None,
    ) -> str:
        openai_name = (
            name
            if OPENAI_NAME.match(name) and name not in self.schemas
            else _openai_name(name, set(self.schemas))
        )
        if openai_name != name:
            self.renamed.append((name, openai_name))
        function = {"name": openai_name, "description": description, "parameters": parameters}
        self.tools.append({"type": "function", "function": function})
        self.server_names[openai_name] = server_name if server_name is not None else name
        self.schemas[openai_name] = parameters
        return openai_name

    def unforceable(self) -> list[str]:
        """Why a forced call's grammar cannot hold a tool's schema, one line per such tool
        (the policy endpoint refuses to force or `strict`-check a call over it)."""
        problems = []
        for name, schema in self.schemas.items():
            try:
                check_tool_schema(name, schema)
            except ToolSchemaError as e:
                problems.append(str(e))
        return problems

    def only(self, names: Sequence[str]) -> ToolSet:
        """The same tools, less those not in `names` (e.g. the unsafe ones)."""
        keep = set(names)
        return ToolSet(
            tools=[t for t in self.tools if t["function"]["name"] in keep],
            server_names={k: v for k, v in self.server_names.items() if k in keep},
            schemas={k: v for k, v in self.schemas.items() if k in keep},
            skipped=list(self.skipped),
            renamed=list(self.renamed),
            guards={k: v for k, v in self.guards.items() if k in keep},
        )

    def _guard_error(self, name: str, arguments: dict[str, Any]) -> str | None:
        """Why a guarded tool's call must not reach the server (None: it may)."""
        prop = self.guards.get(name)
        if prop is None or prop not in arguments:
            return None
        problem = read_only_sql_error(arguments[prop])
        return None if problem is None else f"{name} refused {prop}: {problem}"

    def check_call(self, name: str, arguments: str | dict[str, Any] | None) -> CallCheck:
        """Parse and validate one call's arguments (see the module docstring)."""
        from jsonschema import Draft202012Validator

        if name not in self.schemas:
            return CallCheck(
                name, None, f"unknown tool {name!r}; the tools are: {', '.join(self.names)}"
            )
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as e:
                return CallCheck(name, None, f"the arguments of {name} are not valid JSON: {e}")
        arguments = {} if arguments is None else arguments
        if not isinstance(arguments, dict):
            return CallCheck(
                name,
                None,
                f"the arguments of {name} must be a JSON object, not {type(arguments).__name__}",
            )
        validator = Draft202012Validator(self.schemas[name])
        problems = sorted(validator.iter_errors(arguments), key=lambda e: list(e.path))
        if problems:
            first = problems[0]
            where = "/".join(str(p) for p in first.path) or "(top level)"
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            return CallCheck(
                name,
                None,
                f"the arguments of {name} do not match its schema at "
                f"{where}: {first.message}{more}",
            )
        refused = self._guard_error(name, arguments)
        if refused is not None:
            return CallCheck(name, None, refused)
        return CallCheck(self.server_names[name], arguments, None)


def convert_tools(tools: Sequence[Any]) -> ToolSet:
    """Convert MCP tools (objects or dicts) or OpenAI tools into a `ToolSet`."""
    result = ToolSet()
    for tool in tools:
        name, description, schema = _function_parts(tool)
        try:
            if not name:
                raise SchemaError("the tool has no name")
            parameters = convert_schema(schema)
        except SchemaError as e:
            result.skipped.append((name or "?", str(e)))
            continue
        result.add(name, " ".join(description.split()), parameters)
    return result
