"""The engine protocol: what the policy endpoint needs from an inference engine.

An engine serves one base model plus LoRA adapters under served names (`name@step`)
and answers OpenAI chat-completion bodies. The gateway always asks for per-token
logprobs and sampled token ids, so every engine must return, beside the usual fields,
`prompt_token_ids` on the response and `token_ids` plus `logprobs.content` on each
choice. Two engines implement it: vLLM (a supervised subprocess) and transformers
(in-process, the reference for tests).
"""

from __future__ import annotations

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

    async def load_adapter(self, served_name: str, path: Path) -> None:
        """Serve the peft adapter folder `path` under `served_name`."""

    async def unload_adapter(self, served_name: str) -> None:
        """Stop serving `served_name`."""

    async def healthy(self) -> bool:
        """Whether the engine answers right now."""

    async def close(self) -> None:
        """Stop the engine and free its resources."""
