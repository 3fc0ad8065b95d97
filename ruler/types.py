"""RULER's wire types: a score for one trajectory, and what judging cost."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

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


class JudgeUsage(BaseModel):
    """Judge calls and tokens, summed over whatever was scored with it."""

    model_config = ConfigDict(extra="forbid")

    calls: int = 0
    """Requests sent to the judge (retries included, cache hits excluded)."""
    cached_calls: int = 0
    """Answers served from the on-disk cache at no cost."""
    retries: int = 0
    """Attempts after a wrong count, an unusable answer or a failed request."""
    failed_calls: int = 0
    """Judge calls that gave no usable answer after every retry."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None
    """Known only when `RulerConfig.price_per_million_tokens` is set."""

    def add(self, other: JudgeUsage) -> None:
        for name in ("calls", "cached_calls", "retries", "failed_calls", "prompt_tokens",
                     "completion_tokens"):  # fmt: skip
            setattr(self, name, getattr(self, name) + getattr(other, name))
        if other.cost_usd is not None:
            self.cost_usd = (self.cost_usd or 0.0) + other.cost_usd

    def as_metrics(self, prefix: str = "ruler_") -> dict[str, float]:
        metrics = {f"{prefix}{k}": float(v) for k, v in self.model_dump().items() if v is not None}
        return metrics
