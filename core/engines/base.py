"""The engine protocol: what the policy endpoint needs from an inference engine.

An engine serves one base model plus LoRA adapters under served names (`name@step`)
and answers OpenAI chat-completion bodies. The gateway always asks for per-token
logprobs and sampled token ids, so every engine must return, beside the usual fields,
`prompt_token_ids` on the response and `token_ids` plus `logprobs.content` on each
choice, streamed or not. Beside chatting, the endpoint needs two small services: the
model's own log-probs of given tokens (to re-score a completion sampled under a grammar,
see constraint.py) and the text of given token ids (to send a sampled reply back
verbatim, see gateway.py). Two engines implement it: vLLM (a supervised subprocess) and
transformers (in-process, the reference for tests).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rlcoach.errors import EngineHTTPError

__all__ = ["Engine", "EngineHTTPError"]


@runtime_checkable
class Engine(Protocol):
    """An inference engine for one base model and its LoRA adapters."""

    base_name: str
    """The served name of the base model without any adapter."""

    async def start(self) -> None:
        """Start serving; return once the engine answers requests."""

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer a chat-completion body whose `model` is a served name already loaded."""

    def chat_stream(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Answer a `stream=True` body: its `chat.completion.chunk` payloads as they come
        (raise `EngineHTTPError` before the first one if the engine refuses)."""

    async def token_logprobs(self, model: str, token_ids: list[int], start: int) -> list[float]:
        """The log-prob of each of `token_ids[start:]` given the tokens before it, under
        `model`'s own distribution (no sampling constraint, temperature 1)."""

    async def detokenize(self, model: str, token_ids: list[int]) -> str:
        """The text of `token_ids`, special tokens included."""

    async def load_adapter(self, served_name: str, path: Path) -> None:
        """Serve the peft adapter folder `path` under `served_name`."""

    async def unload_adapter(self, served_name: str) -> None:
        """Stop serving `served_name`."""

    async def healthy(self) -> bool:
        """Whether the engine answers right now."""

    async def close(self) -> None:
        """Stop the engine and free its resources."""
