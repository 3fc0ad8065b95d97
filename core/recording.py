"""From recorded exchanges to histories: which calls continue which conversation.

The gateway records every (request, response) of a rollout in arrival order. A call
whose messages start with an earlier history's messages (its sampled reply included)
continues that history; any other call starts a new one (a sub-agent, a summariser, a
judge-like helper). The history with the most sampled choices is the main one. Messages
are compared by role, text and tool calls (name and parsed arguments), so the harmless
differences an OpenAI client introduces when it sends a reply back (`refusal: null`,
reordered keys, `content: ""` for `null`) do not split a conversation.
"""

from __future__ import annotations

import json
from typing import Any

from rlcoach.types import History, Message, choice_from_response_json

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


def assemble_histories(
    exchanges: list[tuple[dict[str, Any], dict[str, Any]]],
) -> tuple[History, list[History]]:
    """Group exchanges into (main history, additional histories)."""
    histories: list[tuple[list[str], History]] = []
    for request, response in exchanges:
        messages = list(request.get("messages") or [])
        tools = request.get("tools") or None
        keys = [message_key(m) for m in messages]
        for index, choice_json in enumerate(response.get("choices") or []):
            choice = choice_from_response_json(choice_json, response)
            target = None
            if index == 0:
                for seen, history in reversed(histories):
                    if len(seen) <= len(keys) and keys[: len(seen)] == seen:
                        target = (seen, history)
                        break
            if target is None:
                history = History(tools=tools)
                histories.append(([], history))
                target = histories[-1]
            seen, history = target
            history.messages = [*messages, choice.message]
            history.choices.append(choice)
            seen[:] = [*keys, message_key(choice.message)]
    if not histories:
        return History(), []
    ordered = [h for _, h in histories]
    main = max(ordered, key=lambda h: len(h.choices))
    return main, [h for h in ordered if h is not main]
