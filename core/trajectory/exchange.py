"""An exchange: one recorded call to the policy, as the rollout that made it gets it back.

The policy endpoint records every chat completion that carries a rollout id: the
client's request body and the response, OpenAI-shaped (with the token ids the endpoint
always returns), plus what the endpoint knows beside it — when the call started and how
long it took (`timing`), and for each choice the positions a grammar forced and the
constraint it sampled under (`notes`, by choice index). Those travel beside the
OpenAI-shaped dicts, never inside them: the gateway hands them to the recorder under
two reserved keys, and `Exchange.recorded` takes them out before anyone else sees the
exchange. Exchanges become a trajectory's histories (histories.py) and cross the wire
of `rlcoach serve` as `as_wire()` / `from_wire()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlcoach.trajectory.trajectories import (
    CHOICE_KEY,
    TIMING_KEY,
    SampledChoice,
    choice_from_response_json,
)

__all__ = ["Exchange"]


@dataclass(frozen=True, slots=True)
class Exchange:
    """One call: the request, the response, and the endpoint's notes on it."""

    request: dict[str, Any]
    """The client's request body (OpenAI's chat-completions shape)."""
    response: dict[str, Any]
    """The chat completion the client got, with `prompt_token_ids` and each choice's
    `token_ids` and log-probs."""
    timing: dict[str, float] = field(default_factory=dict)
    """`started_at` (Unix time) and `latency_s` of the call, where the endpoint timed it."""
    notes: dict[int, dict[str, Any]] = field(default_factory=dict)
    """By choice index: `forced` token positions and the `constraint` sampled under."""

    @classmethod
    def recorded(cls, request: dict[str, Any], response: dict[str, Any]) -> Exchange:
        """An exchange from the dicts the gateway recorded, its reserved keys taken out."""
        response = dict(response)
        timing = response.pop(TIMING_KEY, None) or {}
        notes: dict[int, dict[str, Any]] = {}
        if isinstance(response.get("choices"), list):
            choices = []
            for position, choice in enumerate(response["choices"]):
                if isinstance(choice, dict) and CHOICE_KEY in choice:
                    choice = dict(choice)
                    notes[position] = choice.pop(CHOICE_KEY) or {}
                choices.append(choice)
            response["choices"] = choices
        return cls(request, response, timing, notes)

    def sampled(self, index: int) -> SampledChoice:
        """Choice `index` as the trainer reads it (exact tokens, log-probs, notes)."""
        return choice_from_response_json(
            self.response["choices"][index],
            self.response,
            timing=self.timing,
            note=self.notes.get(index),
        )

    def as_wire(self) -> dict[str, Any]:
        """The JSON object `rlcoach serve` sends for this exchange."""
        return {
            "request": self.request,
            "response": self.response,
            "timing": self.timing,
            "notes": {str(index): note for index, note in self.notes.items()},
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Exchange:
        """An exchange from `as_wire()`'s JSON; a server of the previous release sent the
        notes inside the dicts, and those are taken out the same way."""
        exchange = cls.recorded(data["request"], data["response"])
        timing = {**exchange.timing, **(data.get("timing") or {})}
        notes = {**exchange.notes, **{int(k): v for k, v in (data.get("notes") or {}).items()}}
        return cls(exchange.request, exchange.response, timing, notes)
