"""From recorded exchanges to histories: which calls continue which conversation.

The gateway records every (request, response) of a rollout in arrival order. A call
whose messages start with an earlier history's messages (its sampled reply included)
continues that history; any other call starts a new one (a sub-agent, a summariser, a
judge-like helper). Messages are compared by role, text and tool calls (name and parsed
arguments), so the harmless differences an OpenAI client introduces when it sends a
reply back (`refusal: null`, reordered keys, `content: ""` for `null`) do not split a
conversation.

The main history is the one the user sees:
1. with the app's final messages (a LangGraph state, `record_state`), the history that
   shares the most (non-system) messages with them — the conversation the final state
   continues (a router's or summariser's prompt is not in it);
2. otherwise the history of the last reply returned to the caller (the latest call).
Among equals, and in rule 2, a history whose every reply was constrained (a JSON schema,
a regex, a forced tool choice: a router, a classifier) never wins over one with a free
reply. The other histories are additional.
"""

from __future__ import annotations

import json
from typing import Any

from rlcoach.trajectory.client_choices import MessageList
from rlcoach.trajectory.exchange import Exchange
from rlcoach.trajectory.trajectories import History, Message

__all__ = ["assemble_histories", "content_text", "message_key", "parse_arguments"]


def content_text(content: Any) -> str:
    """A message's text: content parts joined, `[<type>]` for parts that are not text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            (part.get("text") or f"[{part.get('type', 'part')}]")
            if isinstance(part, dict)
            else str(part)
            for part in content
        )
    return str(content)


def parse_arguments(raw: Any) -> Any:
    """Tool-call arguments as JSON values where they parse (the raw string where not)."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    return raw


def message_key(message: Message) -> str:
    """A canonical form of a message: equal for messages a client would consider the same."""
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", call)
        calls.append([function.get("name"), parse_arguments(function.get("arguments"))])
    return json.dumps(
        [
            message.get("role"),
            content_text(message.get("content")).strip(),
            calls,
            message.get("tool_call_id"),
        ],
        sort_keys=True,
    )


def _constrained(history: History) -> bool:
    return bool(history.choices) and all(c.constraint for c in history.choices)


def _main_index(histories: list[History], last_call: list[int], final: list[Message] | None) -> int:
    """Which history is the main one (see the module docstring)."""
    free_first = [0 if _constrained(h) else 1 for h in histories]
    if final:
        keys = {message_key(m) for m in final}
        shared = [
            sum(message_key(m) in keys for m in h.messages if m.get("role") != "system")
            for h in histories
        ]
        if any(shared):
            return max(
                range(len(histories)), key=lambda i: (shared[i], free_first[i], last_call[i])
            )
    return max(range(len(histories)), key=lambda i: (free_first[i], last_call[i]))


def assemble_histories(
    exchanges: list[Exchange],
    final: list[Message] | None = None,
) -> tuple[History, list[History]]:
    """Group exchanges into (main history, additional histories).

    `final`: the app's final messages (OpenAI form), when it reported them."""
    histories: list[tuple[list[str], History]] = []
    last_call: list[int] = []
    for number, exchange in enumerate(exchanges):
        messages = list(exchange.request.get("messages") or [])
        tools = exchange.request.get("tools") or None
        keys = [message_key(m) for m in messages]
        for index in range(len(exchange.response.get("choices") or [])):
            choice = exchange.sampled(index)
            target = None
            if index == 0:
                for position in reversed(range(len(histories))):
                    seen = histories[position][0]
                    if len(seen) <= len(keys) and keys[: len(seen)] == seen:
                        target = position
                        break
            if target is None:
                histories.append(([], History(tools=tools)))
                last_call.append(number)
                target = len(histories) - 1
            seen, history = histories[target]
            history.messages = MessageList([*messages, choice.message])
            history.choices.append(choice)
            seen[:] = [*keys, message_key(choice.message)]
            last_call[target] = number
    if not histories:
        return History(), []
    ordered = [h for _, h in histories]
    main = _main_index(ordered, last_call, final)
    return ordered[main], [h for i, h in enumerate(ordered) if i != main]
