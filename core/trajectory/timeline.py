"""A trajectory as a timeline: its policy calls and the tool calls between them.

Sinks and the report show a rollout as what happened in order: each policy call (the
prompt it saw, the reply, its tokens and timing) and each tool call (name, arguments,
result, whether it failed). The trajectory holds all of it, spread over its messages and
its sampled choices; this module lines them up.

A choice is matched to its assistant message walking backwards (the last choice of a
history is its last assistant reply; an earlier one is the nearest earlier assistant
message equal to it), so worked examples in the prompt are never taken for samples; the
messages before it are the prompt it saw. A tool call is the assistant's `tool_calls`
entry plus the tool message that answers it (by `tool_call_id`, else the next tool
message). Its result counts as an error when the message is flagged so (`"is_error":
true`, set by `tool_message(..., error=True)`, the MCP agent and the LangGraph scope; or
LangChain's `status: "error"`), never by its wording. Timing comes from the policy
endpoint (each choice's `started_at` and `latency_s`) and the rollout scope
(`started_at`, `finished_at`); a tool call is placed between the reply that asked for
it and the next policy call — an upper bound, since tools are not timed separately.
Missing times (older files) fall back to the previous known time in the same
conversation, else the rollout's start.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from rlcoach.trajectory.histories import content_text, message_key, parse_arguments
from rlcoach.trajectory.trajectories import (
    History,
    Message,
    SampledChoice,
    Trajectory,
    is_tool_error,
)

__all__ = ["PolicyCall", "Timeline", "ToolCall", "timeline"]


@dataclass(frozen=True, slots=True)
class PolicyCall:
    """One sampled choice, with the prompt it answered."""

    history: int
    """0 for the main conversation, 1.. for the additional histories."""
    choice: SampledChoice
    prompt: list[Message] | None
    """The messages the policy saw (None when the reply could not be found)."""
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call the policy made, and its answer."""

    history: int
    call_id: str | None
    name: str
    arguments: Any
    """Parsed JSON arguments (the raw string when they are not JSON)."""
    result: str | None
    """The tool message's text; None when no answer was recorded."""
    error: bool
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Timeline:
    """A rollout in order: per history, its policy and tool calls."""

    start: float
    end: float
    histories: list[list[PolicyCall | ToolCall]]

    @property
    def policy_calls(self) -> list[PolicyCall]:
        return [e for h in self.histories for e in h if isinstance(e, PolicyCall)]

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [e for h in self.histories for e in h if isinstance(e, ToolCall)]


def _align(history: History) -> list[int | None]:
    """The index of each choice's assistant message in the history (None: not found)."""
    positions: list[int | None] = [None] * len(history.choices)
    limit = len(history.messages)
    for j in range(len(history.choices) - 1, -1, -1):
        key = message_key(history.choices[j].message)
        for i in range(limit - 1, -1, -1):
            message = history.messages[i]
            if message.get("role") == "assistant" and message_key(message) == key:
                positions[j], limit = i, i
                break
    return positions


def _tool_calls(messages: list[Message], at: int) -> list[tuple[dict[str, Any], Message | None]]:
    """The tool calls of the assistant message `messages[at]`, each with its answer."""
    answers = []
    for message in messages[at + 1 :]:  # the tool messages right after the call
        if message.get("role") != "tool":
            break
        answers.append(message)
    by_id = {m.get("tool_call_id"): m for m in answers if m.get("tool_call_id")}
    pairs = []
    for index, call in enumerate(messages[at].get("tool_calls") or []):
        answer = by_id.get(call.get("id")) if call.get("id") else None
        if answer is None and index < len(answers) and not answers[index].get("tool_call_id"):
            answer = answers[index]
        pairs.append((call, answer))
    return pairs


def _history_events(
    number: int,
    history: History,
    start: float,
    end: float,
) -> list[PolicyCall | ToolCall]:
    positions = _align(history)
    events: list[PolicyCall | ToolCall] = []
    clock = start
    calls: list[tuple[int, PolicyCall]] = []
    for choice, position in zip(history.choices, positions, strict=True):
        begin = choice.started_at if choice.started_at is not None else clock
        finish = begin + (choice.latency_s or 0.0)
        prompt = list(history.messages[:position]) if position is not None else None
        call = PolicyCall(number, choice, prompt, begin, finish)
        calls.append((position if position is not None else -1, call))
        clock = finish
    for k, (position, call) in enumerate(calls):
        events.append(call)
        if position < 0:
            continue
        next_start = calls[k + 1][1].start if k + 1 < len(calls) else max(end, call.end)
        for raw, answer in _tool_calls(history.messages, position):
            function = raw.get("function", raw)
            events.append(
                ToolCall(
                    history=number,
                    call_id=raw.get("id"),
                    name=str(function.get("name", "")),
                    arguments=parse_arguments(function.get("arguments")),
                    result=content_text(answer.get("content")) if answer is not None else None,
                    error=answer is not None and is_tool_error(answer),
                    start=call.end,
                    end=max(next_start, call.end),
                )
            )
    return events


def timeline(trajectory: Trajectory, now: float | None = None) -> Timeline:
    """Line up a trajectory's policy and tool calls (see the module docstring)."""
    starts = [
        c.started_at for h in trajectory.histories() for c in h.choices if c.started_at is not None
    ]
    ends = [
        c.started_at + (c.latency_s or 0.0)
        for h in trajectory.histories()
        for c in h.choices
        if c.started_at is not None
    ]
    fallback = time.time() if now is None else now
    start = trajectory.started_at or (min(starts) if starts else fallback)
    end = trajectory.finished_at or (max(ends) if ends else start)
    histories = [
        _history_events(number, history, start, end)
        for number, history in enumerate(trajectory.histories())
    ]
    latest = max([end, *(e.end for h in histories for e in h)])
    return Timeline(start, latest, histories)
