"""What a client holds after calling a model: messages and OpenAI `Choice` objects.

ART scripts build trajectories from `messages_and_choices`: the conversation's message
dicts with, in place of each assistant reply, the `Choice` object the client received.
Here a `Choice` becomes its assistant message plus a `ClientChoice` that keeps what the
server reported about it (log-probs, token ids when the server returns them), so a
trajectory stays plain JSON on the wire. `MessagesAndChoicesView` gives the mixed list
back, live, for code that appends to `trajectory.messages_and_choices`; `MessageList`
lets `trajectory.messages()` be called as ART calls it. The trainer renders such replies
with the chat template (trainer/render.py).
"""

from __future__ import annotations

from collections.abc import Iterable, MutableSequence
from typing import Any, Protocol, overload

from pydantic import ConfigDict, Field, GetCoreSchemaHandler, model_validator
from pydantic_core import core_schema

from rlcoach.errors import DataError
from rlcoach.validation import Record

__all__ = [
    "ClientChoice",
    "MessageList",
    "MessagesAndChoicesView",
    "check_client_choices",
    "from_messages_and_choices",
    "split_choice",
    "split_messages_and_choices",
]

Message = dict[str, Any]


class _Conversation(Protocol):
    messages: MessageList
    client_choices: list[ClientChoice]


class MessageList(list[Message]):
    """A conversation's messages: a list, also callable — `trajectory.messages()` — since
    that is how ART reads them."""

    def __call__(self) -> list[Message]:
        return list(self)

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(cls, handler(list[Message]))


class ClientChoice(Record):
    """An assistant turn the client received itself, from any OpenAI-compatible server.

    It marks `messages[message_index]` as trained and keeps what the server said about
    it. Without `token_ids` the trainer re-tokenizes the message with the chat template;
    without usable `logprobs` it computes the behaviour log-probs itself (trainer/render.py).
    """

    model_config = ConfigDict(extra="forbid")

    message_index: int = Field(ge=0)
    """The assistant message this choice produced."""
    finish_reason: str | None = None
    token_ids: list[int] | None = None
    """The sampled token ids, where the server returned them (rlcoach's endpoint, vLLM's
    `return_token_ids`, or `token_id:<n>` token strings)."""
    logprobs: list[float] | None = None
    """The server's log-probability of each sampled token."""
    tokens: list[str] | None = None
    """The server's text of each sampled token (to line `logprobs` up with the
    re-tokenized message when there are no `token_ids`)."""

    @model_validator(mode="after")
    def _lengths_agree(self) -> ClientChoice:
        tokens, logprobs = self.tokens, self.logprobs
        if tokens is not None and logprobs is not None and len(tokens) != len(logprobs):
            raise ValueError(
                f"client choice for message {self.message_index} has {len(tokens)} token "
                f"strings but {len(logprobs)} logprobs; fix: pass the choice's "
                "`logprobs.content` unchanged"
            )
        return self


def _plain(value: Any) -> Any:
    """A pydantic object (an `openai` type) as plain data; anything else as it is."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", exclude_none=False)
    return value


def _is_choice(item: Any) -> bool:
    """An OpenAI `Choice` (object or its JSON): a `message` inside, no `role` of its own."""
    data = item if isinstance(item, dict) else None
    if data is None:
        return hasattr(item, "message") and hasattr(item, "finish_reason")
    return "message" in data and "role" not in data


def split_choice(item: Any, message_index: int) -> tuple[Message, ClientChoice]:
    """An OpenAI `Choice` as (its assistant message, the `ClientChoice` that keeps the
    rest)."""
    data = _plain(item)
    message = {k: v for k, v in (data.get("message") or {}).items() if v is not None}
    message["role"] = message.get("role") or "assistant"
    entries = (data.get("logprobs") or {}).get("content") or []
    logprobs = [float(e["logprob"]) for e in entries] or None
    tokens = [str(e.get("token", "")) for e in entries] or None
    token_ids = data.get("token_ids")
    if token_ids is None and tokens and all(t.startswith("token_id:") for t in tokens):
        token_ids = [int(t.partition(":")[2]) for t in tokens]  # vLLM's tokens-as-ids
    if token_ids is not None and logprobs is not None and len(token_ids) != len(logprobs):
        logprobs = tokens = None  # they do not pair up: the trainer computes its own
    return message, ClientChoice(
        message_index=message_index,
        finish_reason=data.get("finish_reason"),
        token_ids=None if token_ids is None else [int(t) for t in token_ids],
        logprobs=logprobs,
        tokens=tokens,
    )


def _as_message(item: Any, index: int) -> Message:
    data = _plain(item)
    if not isinstance(data, dict) or not isinstance(data.get("role"), str):
        raise DataError(
            f"messages_and_choices[{index}] is {type(item).__name__} ({str(item)[:80]!r}), "
            "neither a chat message (a dict with a role) nor an OpenAI Choice; fix: pass "
            "message dicts and `completion.choices[i]` objects"
        )
    return {k: v for k, v in data.items() if v is not None or k == "content"}


def split_messages_and_choices(items: Iterable[Any]) -> tuple[list[Message], list[ClientChoice]]:
    """ART's `messages_and_choices` as (messages, client choices)."""
    messages: list[Message] = []
    choices: list[ClientChoice] = []
    for index, item in enumerate(items):
        if _is_choice(item):
            message, choice = split_choice(item, len(messages))
            messages.append(message)
            choices.append(choice)
        else:
            messages.append(_as_message(item, index))
    return messages, choices


def from_messages_and_choices(data: Any) -> Any:
    """The before-validator of `History` and `Trajectory`: `messages_and_choices=` in."""
    if not isinstance(data, dict) or "messages_and_choices" not in data:
        return data
    data = dict(data)
    items = data.pop("messages_and_choices")
    if data.get("messages") or data.get("client_choices"):
        raise ValueError(
            "give either messages_and_choices (ART's form) or messages (+ client_choices), not both"
        )
    data["messages"], data["client_choices"] = split_messages_and_choices(items or [])
    return data


def check_client_choices(messages: list[Message], choices: list[ClientChoice]) -> None:
    for choice in choices:
        index = choice.message_index
        if index >= len(messages) or messages[index].get("role") != "assistant":
            raise ValueError(
                f"client choice for message {index} does not point at an assistant message "
                f"(there are {len(messages)} messages); fix: build the trajectory from "
                "messages_and_choices, or set message_index to the assistant reply's index"
            )


class MessagesAndChoicesView(MutableSequence[Any]):
    """ART's `messages_and_choices` over a trajectory's messages: reading gives message
    dicts and, for client choices, OpenAI `Choice` objects; appending a `Choice` adds its
    message and marks it trained (`ClientChoice`)."""

    def __init__(self, owner: _Conversation) -> None:
        self._owner = owner

    def _entries(self) -> list[tuple[Message, ClientChoice | None]]:
        by_index = {c.message_index: c for c in self._owner.client_choices}
        return [(m, by_index.get(i)) for i, m in enumerate(self._owner.messages)]

    def _store(self, entries: list[tuple[Message, ClientChoice | None]]) -> None:
        messages: list[Message] = []
        choices: list[ClientChoice] = []
        for message, choice in entries:
            if choice is not None:
                choices.append(choice.model_copy(update={"message_index": len(messages)}))
            messages.append(message)
        # One field at a time is validated against the other: clear the choices first.
        self._owner.client_choices = []
        self._owner.messages = MessageList(messages)
        self._owner.client_choices = choices

    @staticmethod
    def _entry(item: Any) -> tuple[Message, ClientChoice | None]:
        if _is_choice(item):
            return split_choice(item, 0)
        return _as_message(item, 0), None

    @staticmethod
    def _choice_object(message: Message, choice: ClientChoice) -> Any:
        from openai.types.chat.chat_completion import Choice

        content: list[dict[str, Any]] | None = None
        if choice.logprobs is not None:
            tokens = choice.tokens or [""] * len(choice.logprobs)
            content = [
                {"token": t, "logprob": lp, "bytes": None, "top_logprobs": []}
                for t, lp in zip(tokens, choice.logprobs, strict=True)
            ]
        data: dict[str, Any] = {
            "index": 0,
            "finish_reason": choice.finish_reason or "stop",
            "message": message,
            "logprobs": {"content": content} if content is not None else None,
        }
        if choice.token_ids is not None:
            data["token_ids"] = choice.token_ids
        return Choice.model_validate(data)

    def __len__(self) -> int:
        return len(self._owner.messages)

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...
    def __getitem__(self, index: int | slice) -> Any:
        entries = self._entries()
        picked = entries[index] if isinstance(index, slice) else [entries[index]]
        out = [m if c is None else self._choice_object(m, c) for m, c in picked]
        return out if isinstance(index, slice) else out[0]

    def __setitem__(self, index: Any, value: Any) -> None:
        entries = self._entries()
        if isinstance(index, slice):
            entries[index] = [self._entry(v) for v in value]
        else:
            entries[index] = self._entry(value)
        self._store(entries)

    def __delitem__(self, index: int | slice) -> None:
        entries = self._entries()
        del entries[index]
        self._store(entries)

    def insert(self, index: int, value: Any) -> None:
        entries = self._entries()
        entries.insert(index, self._entry(value))
        self._store(entries)

    def __repr__(self) -> str:
        return f"MessagesAndChoicesView({self[:]!r})"
