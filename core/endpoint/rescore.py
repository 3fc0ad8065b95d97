"""Re-scoring: a grammar-constrained completion recorded with the model's own log-probs.

vLLM reports a constrained token's log-prob after the grammar's mask (constraint.py
says why that is wrong for training), so before the gateway (gateway.py) records a
constrained completion, `rescored_choices` asks the engine for the log-probs of the
same tokens without the grammar (`Engine.token_logprobs`) and marks the positions the
grammar forced. The client still gets the engine's own answer.

Where that prompt pass is slow and must run alone (`rescore_alone`: vLLM on a CPU,
which batches by requests, not tokens, took 11.8 s for the log-probs of a 1,500-token
prompt against 0.36 s without them), the gateway records no log-probs for a constrained
completion (`trainer_scored_choices`) and the trainer computes them: it holds the
weights that sampled a step's own rollouts when it trains them (on a CPU sampling and
training never overlap), so its own log-probs are the model's, unconstrained, exact up
to numerics; a choice sampled by other weights is not trained (rollout/staleness.py).
An evaluation rollout's
constrained completion (`model.rollout(evaluation=True)`) is not re-scored: it is kept
as sampled, with every position marked forced, so none of it is ever trained
(`unscored_choices`), as is one whose re-scoring fails.

Where the engine cannot score prompts while other chats run (`rescore_alone`), the
`RescoreGate` that every chat passes lets a re-scoring (with `constrained_logprobs=
"engine"`) or a teacher's scoring (scoring.py) wait until the engine has no chat in
flight, and holds new chats until it is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any, Literal

from rlcoach.endpoint.constraint import forced_positions
from rlcoach.engines.base import Engine, EngineHTTPError
from rlcoach.errors import EngineError
from rlcoach.trajectory.trajectories import CHOICE_KEY

__all__ = ["RescoreGate", "constrained_choices"]

logger = logging.getLogger(__name__)


async def constrained_choices(
    response: dict[str, Any],
    constraint: str,
    by: Literal["engine", "trainer", "evaluation"],
    engine: Engine,
    gate: RescoreGate,
    engine_name: str,
) -> list[dict[str, Any]]:
    """The choices of a constrained completion as recorded: re-scored by the engine, left
    to the trainer, or (an evaluation's) kept as sampled and untrained."""
    if by == "evaluation":
        return unscored_choices(constraint, response)
    if by == "trainer":
        return trainer_scored_choices(constraint, response)
    return await rescored_choices(engine, gate, engine_name, constraint, response)


async def rescored_choices(
    engine: Engine, gate: RescoreGate, engine_name: str, constraint: str, response: dict[str, Any]
) -> list[dict[str, Any]]:
    """The choices of a constrained completion, re-scored. Called by a chat inside `gate`:
    the chat itself is done, so it leaves the gate while the re-scoring waits and runs,
    and enters it again after."""
    prompt = list(response.get("prompt_token_ids") or [])
    await gate.leave()
    try:
        async with gate.alone():
            return [
                await _rescored(engine, engine_name, constraint, prompt, choice)
                for choice in response["choices"]
            ]
    finally:
        await gate.enter()


async def _rescored(
    engine: Engine, engine_name: str, constraint: str, prompt: list[int], choice: dict[str, Any]
) -> dict[str, Any]:
    """A constrained choice with the model's own log-probs and its forced positions."""
    content = (choice.get("logprobs") or {}).get("content") or []
    forced = forced_positions(choice)
    try:
        free = await engine.token_logprobs(
            engine_name, [*prompt, *choice["token_ids"]], len(prompt)
        )
    except (EngineError, EngineHTTPError) as e:
        logger.warning("could not re-score a constrained completion (%s); not trained", e)
        return _untrained(constraint, choice)
    entries = [
        {"token": entry.get("token"), "logprob": logprob}
        for entry, logprob in zip(content, free, strict=True)
    ]
    extra = {"forced": forced, "constraint": constraint}
    return {**choice, "logprobs": {"content": entries}, CHOICE_KEY: extra}


def unscored_choices(constraint: str, response: dict[str, Any]) -> list[dict[str, Any]]:
    """The choices of a constrained completion that is not re-scored (an evaluation's):
    the tokens kept with the engine's log-probs, none of them trained."""
    return [_untrained(constraint, choice) for choice in response["choices"]]


def trainer_scored_choices(constraint: str, response: dict[str, Any]) -> list[dict[str, Any]]:
    """The choices of a constrained completion whose log-probs the trainer computes: every
    position recorded without one (None; NaN in the trajectory, which the trainer's own
    log-prob at the sampling weights stands in for, objective.py), the forced ones marked."""
    scored = []
    for choice in response["choices"]:
        content = (choice.get("logprobs") or {}).get("content") or []
        entries = [{"token": entry.get("token"), "logprob": None} for entry in content]
        extra = {"forced": forced_positions(choice), "constraint": constraint}
        scored.append({**choice, "logprobs": {"content": entries}, CHOICE_KEY: extra})
    return scored


def _untrained(constraint: str, choice: dict[str, Any]) -> dict[str, Any]:
    """A constrained choice whose free log-probs are unknown: every position marked forced,
    so that no token of it is trained."""
    content = (choice.get("logprobs") or {}).get("content") or []
    entries = [{"token": entry.get("token"), "logprob": entry["logprob"]} for entry in content]
    extra = {"forced": list(range(len(content))), "constraint": constraint}
    return {**choice, "logprobs": {"content": entries}, CHOICE_KEY: extra}


class RescoreGate:
    """Counts the chats in flight on the engine and lets a re-scoring run with none of
    them, where the engine needs that (`rescore_alone`, vLLM on a CPU); a no-op
    elsewhere. New chats wait while a re-scoring waits or runs.

    Re-scorings that wait together run together, one after another, in one pause of the
    chats: the chats of a wave of rollouts end at about the same time, and each one's
    re-scoring joins the pause the first one began instead of waiting for a pause of its
    own (one pause each let a newly admitted chat run between two re-scorings, so a step's
    rollouts advanced in waves of a few). They run one at a time even then: the engine
    that needs the pause also fails on two prompt passes of an adapter in one batch."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._active = 0
        self._rescoring = 0  # re-scorings waiting for the pause or running in it
        self._changed: asyncio.Condition | None = None  # made in the gateway's own loop
        self._one_at_a_time: asyncio.Lock | None = None

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
            self._one_at_a_time = asyncio.Lock()
        return self._changed

    async def enter(self) -> None:
        if self.enabled:
            changed = self._condition()
            async with changed:
                await changed.wait_for(lambda: self._rescoring == 0)
                self._active += 1

    async def leave(self) -> None:
        if self.enabled:
            changed = self._condition()
            async with changed:
                self._active -= 1
                changed.notify_all()

    @contextlib.asynccontextmanager
    async def alone(self) -> AsyncIterator[None]:
        if not self.enabled:
            yield
            return
        changed = self._condition()
        async with changed:
            self._rescoring += 1
            await changed.wait_for(lambda: self._active == 0)
        try:
            assert self._one_at_a_time is not None
            async with self._one_at_a_time:
                yield
        finally:
            async with changed:
                self._rescoring -= 1
                changed.notify_all()
