"""RULER's wire types: a score for one trajectory, and what judging cost."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from rlcoach.models.usage import ModelUsage

__all__ = ["JudgeScore", "JudgeUsage"]


class JudgeScore(BaseModel):
    """The judge's verdict on one trajectory of a group."""

    model_config = ConfigDict(extra="forbid")

    index: int
    """Position of the trajectory in the input."""
    score: float = Field(ge=0.0, le=1.0)
    """The mean over orderings, in [0, 1]."""
    explanation: str = ""
    """The judge's reason (JSON mode) or the digit distribution it came from (probs mode)."""
    ordering_scores: list[float] = Field(default_factory=list)
    """The score under each ordering that the judge answered; their spread shows position
    bias."""

    @property
    def spread(self) -> float:
        """Largest minus smallest score across orderings (0 with one ordering)."""
        if not self.ordering_scores:
            return 0.0
        return max(self.ordering_scores) - min(self.ordering_scores)


JudgeUsage = ModelUsage
"""What judging cost: calls, cache hits, retries, failed calls, tokens, USD."""
