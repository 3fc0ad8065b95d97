"""How a group is shown to the judge: the shared context once, then each attempt's own part.

The attempts of one group usually start with the same messages (system prompt, task), so
the longest common prefix of their main conversations is rendered once as the shared
context, and each trajectory shows only what follows it: its assistant turns, tool calls
with their arguments, tool results (errors included) and, below, its additional
histories (sub-agents, summarisers). Tools are listed once when every attempt was
offered the same ones, and per trajectory when they differ. Messages are rendered as
compact tagged lines, not JSON, so a small judge spends its context on content.
Attempts whose rendering is identical are judged once (`RenderedGroup.index` maps each
attempt to its unique body).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from rlcoach.errors import ConfigError
from rlcoach.trajectory.histories import content_text, message_key
from rlcoach.trajectory.trajectories import Message, Tool, Trajectory, is_tool_error

__all__ = ["Candidate", "RenderedGroup", "render_group", "render_message", "render_tools"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One attempt as the judge sees it: main conversation, its tools, extra histories."""

    messages: Sequence[Message]
    tools: Sequence[Tool] | None = None
    extra: Sequence[tuple[Sequence[Message], Sequence[Tool] | None]] = field(default=())

    @classmethod
    def from_trajectory(cls, trajectory: Trajectory) -> Candidate:
        extra = [(h.messages, h.tools) for h in trajectory.additional_histories]
        return cls(trajectory.messages, trajectory.tools, extra)


@dataclass(frozen=True, slots=True)
class RenderedGroup:
    """The judge's view of a group."""

    context: str
    """The shared prefix (and the shared tools), shown once."""
    bodies: list[str]
    """One rendering per unique attempt."""
    index: list[int]
    """For each attempt, in input order, the position of its body in `bodies`."""

    @property
    def digest(self) -> str:
        """A stable hash of the whole rendering (seeds the orderings)."""
        text = json.dumps([self.context, self.bodies])
        return hashlib.sha256(text.encode()).hexdigest()


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit} more characters]"


def render_message(message: Message, limit: int = 4000) -> str:
    """One message as tagged lines: `[role] text`, `[assistant calls] name({...})`; a
    tool message flagged as failed is a `[tool error]`."""
    role = str(message.get("role", "unknown"))
    text = _clip(content_text(message.get("content")).strip(), limit)
    if role == "tool":
        name = message.get("name")
        kind = "tool error" if is_tool_error(message) else "tool result"
        return f"[{kind}{f' from {name}' if name else ''}] {text}"
    lines = []
    calls = message.get("tool_calls") or []
    if text or not calls:
        lines.append(f"[{role}] {text}")
    for call in calls:
        function = call.get("function", call) if isinstance(call, dict) else {}
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        lines.append(f"[{role} calls tool] {function.get('name')}({_clip(arguments, limit)})")
    return "\n".join(lines)


def render_tools(tools: Sequence[Tool]) -> str:
    """One line per tool: `- name(arg: type, ...): description` (OpenAI or MCP shapes)."""
    lines = []
    for tool in tools:
        function = tool.get("function", tool)
        schema = function.get("parameters") or function.get("inputSchema") or {}
        properties = schema.get("properties") or {}
        arguments = ", ".join(
            f"{name}: {spec.get('type', 'any') if isinstance(spec, dict) else 'any'}"
            for name, spec in properties.items()
        )
        description = " ".join(str(function.get("description") or "").split())
        line = f"- {function.get('name')}({arguments})"
        lines.append(f"{line}: {description}" if description else line)
    return "\n".join(lines)


def _tools_key(tools: Sequence[Tool] | None) -> str:
    return json.dumps(list(tools or []), sort_keys=True)


def _common_prefix(key_lists: list[list[str]]) -> int:
    length = min(len(keys) for keys in key_lists)
    for position in range(length):
        if len({keys[position] for keys in key_lists}) > 1:
            return position
    return length


def render_group(candidates: Sequence[Candidate], limit: int = 4000) -> RenderedGroup:
    """Render `candidates` (at least one) for the judge; `limit` caps each message's text."""
    if not candidates:
        raise ConfigError(
            "render_group got no candidates: a judge compares attempts; fix: pass at least "
            "one Candidate"
        )
    keys = [[message_key(m) for m in c.messages] for c in candidates]
    shared = _common_prefix(keys)
    same_tools = len({_tools_key(c.tools) for c in candidates}) == 1
    first = candidates[0]
    context_parts = [render_message(m, limit) for m in first.messages[:shared]]
    context = "\n".join(context_parts) if context_parts else "(no shared messages)"
    if same_tools and first.tools:
        context += "\n\nTools offered to every trajectory:\n" + render_tools(first.tools)
    bodies: list[str] = []
    index: list[int] = []
    for candidate in candidates:
        parts = []
        if not same_tools:
            offered = render_tools(candidate.tools) if candidate.tools else "(none)"
            parts.append("Tools offered:\n" + offered)
        rest = [render_message(m, limit) for m in candidate.messages[shared:]]
        parts.append("\n".join(rest) if rest else "(nothing after the shared context)")
        for number, (messages, tools) in enumerate(candidate.extra, start=1):
            lines = [f"Additional conversation {number} (a sub-agent or helper call):"]
            if tools:
                lines.append("Tools offered:\n" + render_tools(tools))
            lines += [render_message(m, limit) for m in messages]
            parts.append("\n".join(lines))
        body = "\n\n".join(parts)
        if body not in bodies:
            bodies.append(body)
        index.append(bodies.index(body))
    return RenderedGroup(context, bodies, index)
