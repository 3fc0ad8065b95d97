"""RulerConfig: how the judge is asked, retried, cached and what a failure does.

Two scoring modes (see docs/ruler.md for when to use which):

- `json` — one call per ordering: the judge writes `{"<id>": {"explanation", "score"}}`
  for every trajectory. The request carries a strict JSON schema (`response_format`),
  which vLLM and hosted APIs enforce by constrained decoding; the answer is validated
  anyway and retried with the error fed back. Use it with judges that can reason about
  a group (hosted models, 7B+ local ones).
- `probs` — one call per trajectory per ordering, with `max_tokens=1`: the judge sees
  the whole group and is asked for one digit 0-9 for one trajectory; the score is the
  expected digit under the judge's top log-probabilities (renormalised over digits),
  divided by 9. Nothing can be malformed, so it works with the bundled 135M model and
  costs one prefill per trajectory (the shared prompt prefix is cached by vLLM).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field

from rlcoach.models.bundled import cache_dir
from rlcoach.validation import Config

__all__ = ["RulerConfig", "default_cache_dir"]


def default_cache_dir() -> Path:
    """`$RLCOACH_CACHE/ruler` (default `~/.cache/rlcoach/ruler`)."""
    return cache_dir() / "ruler"


class RulerConfig(Config):
    """How RULER asks the judge: `json` (the default) for capable judges, `probs` for small."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["json", "probs"] = "json"
    """`json`: the judge writes scores and explanations; `probs`: digit probabilities."""
    n_orderings: int = Field(1, ge=1, le=16)
    """Judge each group under this many shuffled orderings and average the scores."""
    max_retries: int = Field(2, ge=0, le=10)
    """Extra attempts per judge call after a wrong count, bad JSON or a failed request."""
    timeout_s: float = Field(120.0, gt=0)
    """Upper bound on one judge call; a call that exceeds it counts as failed."""
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    max_tokens: int | None = Field(None, ge=16)
    """JSON mode's completion budget; default 64 + 40 + explanation_max_chars/3 per id."""
    explanation_max_chars: int = Field(160, ge=0, le=4000)
    """Length cap on each explanation in the JSON schema (0: no explanations asked)."""
    structured_output: bool = True
    """Send the answer's JSON schema as `response_format` (turn off for endpoints that
    reject it; the answer is still validated and retried)."""
    top_logprobs: int = Field(20, ge=1, le=20)
    """`probs` mode: how many alternatives of the digit token to read."""
    min_digit_probability: float = Field(1e-4, ge=0.0, lt=1.0)
    """`probs` mode: below this total probability on digits the answer is unusable."""
    message_chars: int = Field(4000, ge=100)
    """Each message's text is cut to this many characters in the judge's prompt."""
    max_concurrency: int = Field(8, ge=1)
    """Judge calls in flight at once, per `score` call."""
    cache_dir: Path | None = Field(default_factory=default_cache_dir)
    """Judge answers are cached here, keyed by the full request; None turns caching off."""
    cache_max_entries: int = Field(100_000, ge=1)
    """Answers kept in the cache; the least recently used go first (counted)."""
    on_failure: Literal["keep", "drop", "raise"] = "keep"
    """`score_group` when the judge fails: keep the original rewards, drop the group's
    trajectories (recorded as failures), or raise `JudgeError`."""
    seed: int = 0
    """Seeds the orderings (and the judge's sampling, where it honours `seed`)."""
    price_per_million_tokens: tuple[float, float] | None = None
    """(prompt, completion) USD per million tokens, to report the cost of judging."""
    extra_body: dict[str, Any] = Field(default_factory=dict)
    """Extra request fields for the judge's server (e.g. vLLM sampling options)."""
