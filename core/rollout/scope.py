"""The rollout scope: calls made inside it are recorded as one trajectory.

    async with model.rollout(task="add-17") as rollout:
        reply = await client.chat.completions.create(model=model.served_name, ...)
        rollout.reward = score(reply)
    trajectory = rollout.trajectory

The scope puts its id in a context variable; clients from `model.openai_client()` send
it as the `X-RLCoach-Rollout` header, so code deep inside an agent framework is
recorded without passing anything around (asyncio tasks inherit the variable). On exit
the gateway's exchanges for that id become the trajectory's histories.

`model.rollout(evaluation=True)` is a rollout that is measured, never trained on (a
held-out split): its clients also send `X-RLCoach-Evaluation: 1`, and the policy
endpoint records a grammar-constrained reply as it was sampled instead of re-scoring it
without the grammar (a prompt pass of its own, alone on a CPU engine): such a reply is
kept out of the loss should the trajectory ever reach a trainer.
"""

from __future__ import annotations

import contextvars
import time
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

from rlcoach.trajectory.exchange import Exchange
from rlcoach.trajectory.histories import assemble_histories
from rlcoach.trajectory.trajectories import Message, Scalar, Trajectory

if TYPE_CHECKING:
    from collections.abc import Awaitable

__all__ = ["ExchangeSource", "Rollout", "current_rollout_id", "evaluating"]

_CURRENT: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "rlcoach_rollout", default=None
)
_EVALUATING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "rlcoach_evaluation", default=False
)


def current_rollout_id() -> str | None:
    """The id of the innermost active rollout scope, if any."""
    return _CURRENT.get()


def evaluating() -> bool:
    """Whether the innermost active rollout scope is an evaluation (never trained on)."""
    return _EVALUATING.get()


class ExchangeSource(Protocol):
    """Where a rollout's recorded exchanges come from (a backend)."""

    def take_exchanges(self, rollout_id: str) -> Awaitable[list[Exchange]]: ...


class Rollout:
    """An async context manager that records one trajectory."""

    def __init__(
        self, source: ExchangeSource, *, evaluation: bool = False, **metadata: Scalar
    ) -> None:
        self._source = source
        self.evaluation = evaluation
        self.trajectory = Trajectory(metadata=dict(metadata))
        self._token: contextvars.Token[str | None] | None = None
        self._mode: contextvars.Token[bool] | None = None

    @property
    def id(self) -> str:
        return self.trajectory.id

    @property
    def reward(self) -> float:
        return self.trajectory.reward

    @reward.setter
    def reward(self, value: float) -> None:
        self.trajectory.reward = float(value)

    @property
    def metrics(self) -> dict[str, float]:
        return self.trajectory.metrics

    @property
    def metadata(self) -> dict[str, Scalar]:
        """What the rollout was about (task id, split, ...); starts with the keywords
        given to `model.rollout(...)` and is kept with the trajectory."""
        return self.trajectory.metadata

    def log(self, line: str) -> None:
        self.trajectory.logs.append(line)

    async def __aenter__(self) -> Rollout:
        self._token = _CURRENT.set(self.trajectory.id)
        self._mode = _EVALUATING.set(self.evaluation)
        self.trajectory.started_at = time.time()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._token is not None:
            _CURRENT.reset(self._token)
            self._token = None
        if self._mode is not None:
            _EVALUATING.reset(self._mode)
            self._mode = None
        self.trajectory.finished_at = time.time()
        await self.collect()

    def final_messages(self) -> list[Message] | None:
        """The conversation the app ended with, when it reported one (see recording.py:
        it decides which history is the main one); None here."""
        return None

    async def collect(self) -> Trajectory:
        """Move the exchanges recorded so far into the trajectory."""
        exchanges = await self._source.take_exchanges(self.trajectory.id)
        if exchanges:
            main, others = assemble_histories(exchanges, self.final_messages())
            t = self.trajectory
            t.messages, t.tools = main.messages, main.tools
            t.choices = [*t.choices, *main.choices]
            t.additional_histories = [*t.additional_histories, *others]
        return self.trajectory
