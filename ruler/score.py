"""RULER's entry points: score message lists, score a group, hook into gathering.

    from rlcoach.ruler import after_each, score_group
    groups = await gather_trajectory_groups(..., after_each=after_each(judge))

`score` judges plain conversations and returns one `JudgeScore` per conversation, in
input order. It renders the group once (identical attempts are judged once), then for
each of `n_orderings` orderings shuffles the attempts — a fresh permutation per call,
seeded by the group's content so a re-run asks the same questions and hits the cache —,
asks the judge and maps each score back to its attempt. The final score is the mean
over orderings; their spread is reported, since a judge whose scores move with the
order is showing position bias.

`score_group` returns a new group (the input is never mutated) whose rewards are the
judge's scores: each trajectory keeps its previous reward in `metrics["original_reward"]`
and gets the judge's `Verdict` (score, explanation); the group's metadata carries the judge's
usage (`ruler_calls`, `ruler_prompt_tokens`, ...). When the judge fails it records the
failure and keeps the original rewards, drops the group, or raises, as configured.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
from collections.abc import Iterable, Sequence
from typing import Any

from rlcoach.config import parse_config
from rlcoach.errors import ConfigError
from rlcoach.model import Model
from rlcoach.providers import as_model
from rlcoach.rollout.gather import AfterEach
from rlcoach.ruler.config import RulerConfig
from rlcoach.ruler.judge import JudgeError, JudgeSession
from rlcoach.ruler.render import Candidate, render_group
from rlcoach.ruler.rubric import DEFAULT_RUBRIC
from rlcoach.ruler.types import JudgeScore, JudgeUsage
from rlcoach.trajectory.trajectories import Message, RolloutFailure, Tool, TrajectoryGroup, Verdict

__all__ = ["after_each", "judge_usage", "score", "score_candidates", "score_group"]

logger = logging.getLogger(__name__)


def _orderings(count: int, n: int, digest: str, seed: int) -> list[list[int]]:
    orders = []
    for number in range(n):
        rng = random.Random(hashlib.sha256(f"{seed}:{number}:{digest}".encode()).digest())
        order = list(range(count))
        rng.shuffle(order)
        orders.append(order)
    return orders


async def score_candidates(
    candidates: Sequence[Candidate],
    judge: Model | str,
    *,
    rubric: str = DEFAULT_RUBRIC,
    config: RulerConfig | dict[str, Any] | None = None,
    usage: JudgeUsage | None = None,
) -> list[JudgeScore]:
    """Judge `candidates` relative to each other (see the module docstring)."""
    config = parse_config(RulerConfig, config)
    judge = as_model(judge)
    if not candidates:
        return []
    rendered = render_group(candidates, config.message_chars)
    unique = len(rendered.bodies)
    session = JudgeSession(judge, config)
    ask = session.json_scores if config.mode == "json" else session.digit_scores
    try:
        orders = _orderings(unique, config.n_orderings, rendered.digest, config.seed)
        outcomes = await asyncio.gather(
            *(ask(rendered, order, rubric) for order in orders), return_exceptions=True
        )
    finally:
        await session.close()
        if usage is not None:
            usage.add(session.usage)
    per_body: list[list[float]] = [[] for _ in range(unique)]
    notes = [""] * unique
    errors = []
    for order, outcome in zip(orders, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            if not isinstance(outcome, JudgeError):
                raise outcome
            errors.append(outcome)
            continue
        scores, explanations = outcome
        for body, value, explanation in zip(order, scores, explanations, strict=True):
            per_body[body].append(value)
            notes[body] = notes[body] or explanation
    if errors and len(errors) == len(orders):
        raise errors[0]
    if errors:
        logger.warning(
            "%d of %d judge orderings failed; scoring with the rest: %s",
            len(errors),
            len(orders),
            errors[0],
        )
    results = []
    for index, body in enumerate(rendered.index):
        values = per_body[body]
        results.append(
            JudgeScore(
                index=index,
                score=sum(values) / len(values),
                explanation=notes[body],
                ordering_scores=values,
            )
        )
    return results


async def score(
    message_lists: Sequence[Sequence[Message]],
    judge: Model | str,
    *,
    rubric: str = DEFAULT_RUBRIC,
    tools: Sequence[Tool] | Sequence[Sequence[Tool] | None] | None = None,
    config: RulerConfig | dict[str, Any] | None = None,
    usage: JudgeUsage | None = None,
) -> list[JudgeScore]:
    """Score conversations (attempts at one task) from 0 to 1 relative to each other.

    `tools` is one tool list offered to every conversation, or one list (or None) per
    conversation. Raises `JudgeError` when the judge gives no usable answer.
    """
    if tools is None or all(isinstance(t, dict) for t in tools):
        per_conversation: list[Any] = [tools] * len(message_lists)
    else:
        per_conversation = list(tools)
        if len(per_conversation) != len(message_lists):
            raise ConfigError(
                f"tools has {len(per_conversation)} lists for {len(message_lists)} "
                "conversations; fix: pass one tool list for all, or one per conversation"
            )
    pairs = zip(message_lists, per_conversation, strict=True)
    candidates = [Candidate(list(messages), offered) for messages, offered in pairs]
    return await score_candidates(candidates, judge, rubric=rubric, config=config, usage=usage)


def _litellm_params(config: RulerConfig, params: dict[str, Any] | None) -> RulerConfig:
    """ART's `extra_litellm_params` as RulerConfig fields (the rest go in the body)."""
    if not params:
        return config
    params = dict(params)
    endpoint = sorted({"api_base", "base_url", "api_key"} & set(params))
    if endpoint:
        raise ConfigError(
            f"extra_litellm_params {endpoint} choose the judge's endpoint, which rlcoach "
            "takes from the judge itself; fix: pass judge=Model('name', base_url=..., "
            "api_key_env='MY_API_KEY') instead"
        )
    update: dict[str, Any] = {}
    for name in ("temperature", "max_tokens", "seed"):
        if name in params:
            update[name] = params.pop(name)
    if "timeout" in params:
        update["timeout_s"] = params.pop("timeout")
    update["extra_body"] = {**config.extra_body, **params}
    return parse_config(RulerConfig, {**config.model_dump(), **update})


async def score_group(
    group: TrajectoryGroup,
    judge: Model | str,
    *,
    rubric: str = DEFAULT_RUBRIC,
    config: RulerConfig | dict[str, Any] | None = None,
    extra_litellm_params: dict[str, Any] | None = None,
    swallow_exceptions: bool | None = None,
    debug: bool = False,
) -> TrajectoryGroup | None:
    """A copy of `group` whose rewards are the judge's scores (see the module docstring).

    `judge` is a `Model` or a `provider/model` string ("openai/gpt-4.1", its key from
    `OPENAI_API_KEY`; see providers.py). ART's keywords work as there:
    `extra_litellm_params` (temperature, max_tokens, ... for the judge's request),
    `swallow_exceptions` (True: None when the judge fails; False: raise `JudgeError`;
    left out: `config.on_failure` decides) and `debug` (log each score's explanation)."""
    config = _litellm_params(parse_config(RulerConfig, config), extra_litellm_params)
    if swallow_exceptions is not None:
        config = config.model_copy(update={"on_failure": "drop" if swallow_exceptions else "raise"})
    judge = as_model(judge)
    scored = group.model_copy(deep=True)
    if len(scored.trajectories) < 2:
        scored.metadata["ruler_skipped"] = "fewer than 2 trajectories to compare"
        return scored
    usage = JudgeUsage()
    candidates = [Candidate.from_trajectory(t) for t in scored.trajectories]
    try:
        results = await score_candidates(
            candidates, judge, rubric=rubric, config=config, usage=usage
        )
    except JudgeError as e:
        scored.metadata.update(usage.as_metrics("ruler_"))
        scored.metadata["ruler_failed"] = True
        scored.metadata["ruler_error"] = str(e)
        if config.on_failure == "raise":
            raise
        action = "keeping its rewards" if config.on_failure == "keep" else "dropping it"
        logger.warning("RULER could not score a group (%s); %s", e, action)
        if swallow_exceptions:
            return None  # ART's contract: a group the judge failed on is skipped
        if config.on_failure == "drop":
            scored.failures += [
                RolloutFailure(type="JudgeError", message=str(e)) for _ in scored.trajectories
            ]
            scored.trajectories = []
        else:
            for trajectory in scored.trajectories:
                trajectory.verdicts.append(Verdict(judge="ruler", error=f"{e}; reward kept"))
        return scored
    for trajectory, result in zip(scored.trajectories, results, strict=True):
        trajectory.metrics["original_reward"] = trajectory.reward
        trajectory.metrics["ruler_score"] = result.score
        trajectory.metrics["ruler_order_spread"] = result.spread
        trajectory.reward = result.score
        trajectory.verdicts.append(
            Verdict(judge="ruler", score=result.score, explanation=result.explanation)
        )
        if debug:
            logger.info("RULER %.3f for %s: %s", result.score, trajectory.id, result.explanation)
    scored.metadata.update(usage.as_metrics("ruler_"))
    scored.metadata["ruler_failed"] = False
    return scored


def after_each(
    judge: Model | str,
    *,
    rubric: str = DEFAULT_RUBRIC,
    config: RulerConfig | dict[str, Any] | None = None,
) -> AfterEach:
    """A `gather_trajectory_groups(after_each=...)` hook that scores each finished group."""
    config = parse_config(RulerConfig, config)

    judge = as_model(judge)

    async def hook(group: TrajectoryGroup) -> TrajectoryGroup | None:
        return await score_group(group, judge, rubric=rubric, config=config)

    return hook


def judge_usage(groups: Iterable[TrajectoryGroup]) -> dict[str, float]:
    """The judge's usage summed over `groups` (one step's metrics), from their metadata."""
    total: dict[str, float] = {}
    failed = 0
    for group in groups:
        for key, value in group.metadata.items():
            if (
                key.startswith("ruler_")
                and isinstance(value, int | float)
                and not isinstance(value, bool)
            ):
                total[key] = total.get(key, 0.0) + float(value)
        failed += bool(group.metadata.get("ruler_failed"))
    total["ruler_failed_groups"] = float(failed)
    return total
