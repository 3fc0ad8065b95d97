"""Client-side capture: what a plain `Model` said inside a rollout scope.

The policy's calls are recorded server side, by the gateway, with their exact tokens.
A model that is not behind the gateway — a hosted teacher for distillation, any
OpenAI-compatible server — can still have its conversations kept, as messages (there
are no sampled token ids to keep): `Model.rollout()` opens a `CapturedRollout`, and the
httpx client behind `Model.openai_client()` hands every chat completion made inside it,
streamed or not, to the model's `ClientRecorder`. On exit the longest conversation
becomes the trajectory's messages (its tools included) and the other conversations
(sub-agents, summarisers) its additional histories, so SFT can imitate all of them.

A streamed answer is read whole before the caller sees it (the recorder needs the
complete message, folded by stream.py's `CompletionAssembler`, as the gateway folds the
policy's streams); the caller still iterates over the same chunks.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx

from rlcoach.endpoint.gateway import ROLLOUT_HEADER
from rlcoach.engines.stream import streamed_completion
from rlcoach.rollout.scope import Rollout, current_rollout_id
from rlcoach.trajectory.client_choices import MessageList
from rlcoach.trajectory.exchange import Exchange
from rlcoach.trajectory.histories import message_key
from rlcoach.trajectory.trajectories import History, Message, Scalar

__all__ = ["CapturedRollout", "ClientRecorder"]

logger = logging.getLogger(__name__)

_EXTENSION = "rlcoach_capture"


class ClientRecorder:
    """Chat completions made through one model's clients, kept per rollout id."""

    def __init__(self) -> None:
        self._open: set[str] = set()
        self._exchanges: dict[str, list[Exchange]] = {}
        self.errors = 0
        """Responses that could not be read as a chat completion (logged, not raised)."""

    def open(self, rollout_id: str) -> None:
        self._open.add(rollout_id)

    async def on_request(self, request: httpx.Request) -> None:
        rollout_id = current_rollout_id()
        if rollout_id in self._open and request.url.path.endswith("/chat/completions"):
            request.extensions[_EXTENSION] = rollout_id
            # Kept here, not by a gateway of ours that this model may point at: it must
            # not record the call as a policy call of a rollout nobody will collect.
            request.headers.pop(ROLLOUT_HEADER, None)

    async def on_response(self, response: httpx.Response) -> None:
        rollout_id = response.request.extensions.get(_EXTENSION)
        if rollout_id is None or response.status_code != 200:
            return
        await response.aread()
        try:
            request = json.loads(response.request.content or b"{}")
            if "text/event-stream" in response.headers.get("content-type", ""):
                body = streamed_completion(response.text)
            else:
                body = response.json()
        except (ValueError, UnicodeDecodeError) as e:
            self.errors += 1
            logger.warning("a chat completion of rollout %s could not be read: %s", rollout_id, e)
            return
        self._exchanges.setdefault(rollout_id, []).append(Exchange(request, body))

    async def take_exchanges(self, rollout_id: str) -> list[Exchange]:
        self._open.discard(rollout_id)
        return self._exchanges.pop(rollout_id, [])


def _conversations(exchanges: list[Exchange]) -> list[History]:
    """Exchanges grouped into conversations: a call extending an earlier one continues it."""
    found: list[tuple[list[str], History]] = []
    for exchange in exchanges:
        request, response = exchange.request, exchange.response
        messages: list[Message] = list(request.get("messages") or [])
        choices = response.get("choices") or []
        if not choices:
            continue
        reply = {k: v for k, v in (choices[0].get("message") or {}).items() if v is not None}
        reply.setdefault("role", "assistant")
        keys = [message_key(m) for m in messages]
        target = next(
            (entry for entry in reversed(found) if keys[: len(entry[0])] == entry[0]), None
        )
        if target is None:
            found.append(([], History(tools=request.get("tools") or None)))
            target = found[-1]
        target[1].messages = MessageList([*messages, reply])
        target[0][:] = [*keys, message_key(reply)]
    return [history for _, history in found]


class CapturedRollout(Rollout):
    """A rollout scope for a plain model: its conversations kept as messages."""

    def __init__(
        self, recorder: ClientRecorder, *, evaluation: bool = False, **metadata: Scalar
    ) -> None:
        super().__init__(recorder, evaluation=evaluation, **metadata)
        recorder.open(self.trajectory.id)

    async def collect(self) -> Any:
        exchanges = await self._source.take_exchanges(self.trajectory.id)
        conversations = _conversations(exchanges)
        if conversations:
            main = max(conversations, key=lambda h: len(h.messages))
            t = self.trajectory
            t.messages, t.tools = main.messages, main.tools
            t.additional_histories = [
                *t.additional_histories,
                *(h for h in conversations if h is not main),
            ]
        return self.trajectory
