"""AutoRL's wire types: one generated training input, and a saved dataset's manifest."""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from rlcoach.trajectory.trajectories import Scalar
from rlcoach.validation import Record

__all__ = ["Difficulty", "InputRecord"]

Difficulty = Literal["easy", "medium", "hard"]


class InputRecord(Record):
    """One training input: what the agent is asked, with a difficulty label."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1)
    """The input as the agent receives it (a user message or task statement)."""
    difficulty: Difficulty = "medium"
    """The generator's estimate; the online difficulty filter measures the real one."""
    id: str = ""
    """A stable id: the hash of the normalised text unless given."""
    metadata: dict[str, Scalar] = Field(default_factory=dict)
    """Where it came from (generator, batch, tools it needs, ...)."""

    @field_validator("text")
    @classmethod
    def _not_blank(cls, text: str) -> str:
        text = text.strip()
        if not text:
            raise ValueError("an input's text must not be blank")
        return text

    def model_post_init(self, context: object) -> None:
        if not self.id:
            from rlcoach.autorl.dedupe import normalize_text

            digest = hashlib.sha256(normalize_text(self.text).encode()).hexdigest()
            self.id = digest[:16]
