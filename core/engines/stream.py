"""Streamed chat completions: relayed chunk by chunk, recorded once whole.

The policy endpoint streams a `stream=True` request token by token: each event the
engine sends is passed to the client as it arrives (its `model` renamed to the served
name), and a `CompletionAssembler` folds the same events into the completion a
non-streamed request would have returned — message (content, reasoning, tool calls),
sampled token ids, per-token log-probs, finish reason, prompt token ids and usage — which
the endpoint records when the stream ends. `streamed_completion` does the same fold
after the fact, for a stream read whole (client-side capture, capture.py).
`completion_events` goes the other way, for an engine that can only answer whole (the
transformers engine): one finished completion cut into chunk events.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

__all__ = [
    "DONE",
    "CompletionAssembler",
    "completion_events",
    "sse_event",
    "streamed_completion",
]

DONE = b"data: [DONE]\n\n"


def sse_event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


class CompletionAssembler:
    """Fold `chat.completion.chunk` payloads into one `chat.completion` body."""

    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.prompt_token_ids: list[int] | None = None
        self.usage: dict[str, Any] | None = None
        self._choices: dict[int, dict[str, Any]] = {}

    def add(self, chunk: dict[str, Any]) -> None:
        for key in ("id", "created", "model"):
            if chunk.get(key) is not None:
                self.head.setdefault(key, chunk[key])
        if chunk.get("prompt_token_ids") is not None:
            self.prompt_token_ids = list(chunk["prompt_token_ids"])
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for part in chunk.get("choices") or []:
            self._add_choice(part)

    def _add_choice(self, part: dict[str, Any]) -> None:
        index = int(part.get("index", 0))
        choice = self._choices.setdefault(
            index,
            {
                "index": index,
                "message": {"role": "assistant", "content": None},
                "finish_reason": None,
                "token_ids": [],
                "logprobs": {"content": []},
            },
        )
        delta = part.get("delta") or {}
        message = choice["message"]
        for field in ("content", "reasoning_content", "reasoning"):
            if delta.get(field):
                message[field] = (message.get(field) or "") + delta[field]
        for call in delta.get("tool_calls") or []:
            calls = message.setdefault("tool_calls", [])
            position = int(call.get("index", len(calls)))
            while len(calls) <= position:
                calls.append(
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
                )
            target = calls[position]
            target["id"] = call.get("id") or target["id"]
            function = call.get("function") or {}
            target["function"]["name"] += function.get("name") or ""
            target["function"]["arguments"] += function.get("arguments") or ""
        choice["token_ids"] += part.get("token_ids") or []
        choice["logprobs"]["content"] += (part.get("logprobs") or {}).get("content") or []
        if part.get("finish_reason"):
            choice["finish_reason"] = part["finish_reason"]
        if "stop_reason" in part:
            choice["stop_reason"] = part["stop_reason"]

    def text(self, index: int) -> str:
        """The content streamed so far for choice `index`."""
        choice = self._choices.get(index)
        return (choice["message"].get("content") or "") if choice else ""

    @property
    def finished(self) -> bool:
        """Every choice got its finish reason (the stream was not cut short)."""
        return bool(self._choices) and all(c["finish_reason"] for c in self._choices.values())

    def completion(self) -> dict[str, Any]:
        """The completion the events add up to."""
        body = {**self.head, "object": "chat.completion"}
        body["choices"] = [self._choices[i] for i in sorted(self._choices)]
        body["prompt_token_ids"] = self.prompt_token_ids
        if self.usage is not None:
            body["usage"] = self.usage
        return body


def completion_events(response: dict[str, Any], include_usage: bool) -> Iterator[bytes]:
    """One finished completion as chunk events (a first chunk per choice with its whole
    message, token ids and log-probs, then its finish), usage, and `[DONE]`."""
    head: dict[str, Any] = {k: response[k] for k in ("id", "created", "model") if k in response}
    head["object"] = "chat.completion.chunk"
    for choice in response["choices"]:
        message = choice.get("message") or {}
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        calls = message.get("tool_calls") or []
        if calls:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
        first = {
            **head,
            "choices": [
                {
                    "index": choice["index"],
                    "delta": delta,
                    "logprobs": choice.get("logprobs"),
                    "finish_reason": None,
                    "token_ids": choice.get("token_ids"),
                }
            ],
            "prompt_token_ids": response.get("prompt_token_ids"),
        }
        yield sse_event(first)
        last = {
            **head,
            "choices": [
                {
                    "index": choice["index"],
                    "delta": {},
                    "finish_reason": choice.get("finish_reason"),
                }
            ],
        }
        yield sse_event(last)
    if include_usage:
        yield sse_event({**head, "choices": [], "usage": response.get("usage")})
    yield DONE


def streamed_completion(text: str) -> dict[str, Any]:
    """The completion a whole server-sent-event stream (its text) adds up to."""
    assembler = CompletionAssembler()
    for line in text.splitlines():
        payload = _payload(line)
        if payload is not None:
            assembler.add(payload)
    return assembler.completion()


async def parse_events(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, Any] | None]:
    """Server-sent-event lines as payloads (None for `[DONE]`)."""
    async for line in lines:
        if line.startswith("data:") and line[len("data:") :].strip():
            yield _payload(line)


def _payload(line: str) -> dict[str, Any] | None:
    """The JSON payload of a `data:` line; None for `[DONE]`, other lines and empty data."""
    if not line.startswith("data:"):
        return None
    data = line[len("data:") :].strip()
    if not data or data == "[DONE]":
        return None
    return json.loads(data)
