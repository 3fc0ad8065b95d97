"""Usage of a helper model (a judge, a task generator): calls, tokens and cost."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["ModelUsage"]


class ModelUsage(BaseModel):
    """Calls and tokens spent on a helper model, summed over whatever used it."""

    model_config = ConfigDict(extra="forbid")

    calls: int = 0
    """Requests sent (retries included, cache hits excluded)."""
    cached_calls: int = 0
    """Answers served from an on-disk cache at no cost."""
    cache_evicted: int = 0
    """Cache entries removed to keep the cache within its size limit."""
    retries: int = 0
    """Attempts after an unusable answer or a failed request."""
    failed_calls: int = 0
    """Calls that gave no usable answer after every retry."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None
    """Known only when a price per token was given."""

    def add(self, other: ModelUsage) -> None:
        for name in (
            "calls",
            "cached_calls",
            "cache_evicted",
            "retries",
            "failed_calls",
            "prompt_tokens",
            "completion_tokens",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        if other.cost_usd is not None:
            self.cost_usd = (self.cost_usd or 0.0) + other.cost_usd

    def count_response(
        self, usage: dict | None, price_per_million_tokens: tuple[float, float] | None
    ) -> None:
        """Add one response's `usage` block (and its cost, when the price is known)."""
        usage = usage or {}
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
        completion_tokens = int(usage.get("completion_tokens") or 0)
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        if price_per_million_tokens is not None:
            prompt_price, completion_price = price_per_million_tokens
            cost = (prompt_tokens * prompt_price + completion_tokens * completion_price) / 1e6
            self.cost_usd = (self.cost_usd or 0.0) + cost

    def as_metrics(self, prefix: str) -> dict[str, float]:
        return {f"{prefix}{k}": float(v) for k, v in self.model_dump().items() if v is not None}
