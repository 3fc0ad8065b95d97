"""Discovery: what an MCP server offers, as the policy will see it.

`discover` connects once, lists the tools, resources and prompts, reads the text
resources (the context scenarios are written from), judges each tool's safety (safety.py:
only the allowed ones are kept) and builds the worked example the prompts carry. It is
the first step of `rlcoach mcp train` (train.py) and AutoRL's `--mcp` tool source
(`tool_source`, found through the `rlcoach.tool_sources` entry point). `load_check`
loads a user's check function named as `module:function`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any

from rlcoach.errors import ConfigError
from rlcoach.integrations.mcp.agent import Check, Example, build_demonstration
from rlcoach.integrations.mcp.connection import ServerSpec, connect
from rlcoach.integrations.mcp.explore import unsafe_only_message
from rlcoach.integrations.mcp.safety import ToolSafety, judge_tool
from rlcoach.integrations.mcp.tools import ToolSet, convert_tools
from rlcoach.trajectory.trajectories import Message

__all__ = ["Discovery", "discover", "load_check", "tool_source"]


@dataclass
class Discovery:
    """What a server offers, as the policy will see it."""

    server_name: str
    instructions: str | None
    tools: ToolSet
    resources: list[str]
    prompts: list[str]
    context: str
    """Resource texts (cut) and the server's instructions, for writing scenarios."""
    demonstration: list[Message]
    safety: dict[str, ToolSafety]
    """Every tool's verdict (`tools` holds only the allowed ones)."""


def load_check(path: str) -> Check:
    """The check function named by `module:function` (e.g. `my_pkg.checks:order_placed`)."""
    import importlib

    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(f"check={path!r} is not `module:function`, e.g. `my_checks:order_placed`")
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as e:
        raise ConfigError(
            f"check={path!r} cannot be loaded ({e}); make the module importable "
            "(on PYTHONPATH or installed) and name a function in it"
        ) from e
    if not callable(function):
        raise ConfigError(f"check={path!r} is a {type(function).__name__}, not a function")
    return function


async def discover(
    spec: ServerSpec,
    *,
    demonstration: bool = True,
    examples: list[Example] | None = None,
    context_chars: int = 3000,
    allow_unsafe: bool = False,
) -> Discovery:
    """Connect, list tools/resources/prompts, read text resources, judge each tool's
    safety (only the allowed ones are kept), build the example."""
    async with connect(spec) as server:
        listed = await server.list_tools()
        tools = convert_tools(listed)
        resources = await server.list_resources()
        prompts = await server.list_prompts()
        parts = [server.instructions] if server.instructions else []
        for resource in resources[:5]:
            if str(getattr(resource, "mime_type", None) or "text").startswith("text"):
                with contextlib.suppress(Exception):
                    text = await server.read_resource(str(resource.uri))
                    parts.append(f"{resource.uri}:\n{text}")
        name, instructions = server.server_name, server.instructions
    if not tools.tools:
        skipped = "; ".join(f"{n}: {why}" for n, why in tools.skipped) or "it lists none"
        raise ConfigError(
            f"MCP server {spec.label!r} offers no usable tools ({skipped}); "
            "there is nothing to train tool use on"
        )
    safety = {}
    for tool in listed:
        renamed = dict(tools.renamed).get(tool.name, tool.name)
        verdict = judge_tool(
            tool.name,
            tool.description or "",
            tool.annotations,
            allow_unsafe=allow_unsafe,
            schema=tools.schemas.get(renamed),
        )
        safety[renamed] = dataclasses.replace(verdict, name=renamed)
    allowed = [n for n in tools.names if safety.get(n) is None or safety[n].allowed]
    if not allowed:
        raise ConfigError(unsafe_only_message(spec, safety))
    tools = tools.only(allowed)
    tools.guards = {n: s.guard for n, s in safety.items() if s.guard and n in tools.schemas}
    example: list[Message] = []
    if demonstration:
        async with connect(spec) as server:  # a throwaway session: the call may change state
            example = await build_demonstration(server, tools, examples or ())
    return Discovery(
        name,
        instructions,
        tools,
        [str(r.uri) for r in resources],
        [p.name for p in prompts],
        "\n\n".join(parts)[:context_chars],
        example,
        safety,
    )


async def tool_source(target: str) -> tuple[list[Any], str | None]:
    """(OpenAI tools, resource context) of a server given as a launch command or an
    http(s) URL: AutoRL's `--mcp` finds this through the `rlcoach.tool_sources` entry point."""
    is_url = target.startswith(("http://", "https://"))
    spec = ServerSpec(url=target) if is_url else ServerSpec.from_command(target)
    found = await discover(spec, demonstration=False, allow_unsafe=True)  # nothing is called
    return found.tools.tools, found.context or None
