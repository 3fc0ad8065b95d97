"""One group of a `verifiers` environment's rollouts, recorded as rlcoach trajectories.

The environment's own `rollout(input, client, model, sampling_args)` runs, unchanged,
with a verifiers client wrapped around `model.openai_client()`: every chat completion it
makes (one for a single-turn environment, one per turn for a multi-turn or tool
environment) goes through the policy endpoint inside an rlcoach rollout scope, so the
gateway records it with its exact sampled tokens under that rollout's id. Then the
environment's rubric scores the whole group (`rubric.score_group`: per-rollout and
group-level reward functions alike), and each trajectory takes the rubric's reward and
its per-function metrics (which reach the sinks as `rollout/<name>`).

What goes wrong is data, as for rlcoach's own rollouts: a rollout that raises, or that
verifiers ended with an error (`state["error"]`), or whose reward is NaN, becomes a
`RolloutFailure` of its group carrying the environment's own traceback; the step trains
on the rest.
"""

from __future__ import annotations

import math
import traceback
from typing import TYPE_CHECKING, Any

from rlcoach import (
    RolloutError,
    RolloutFailure,
    TrajectoryGroup,
    gather_trajectory_groups,
)

if TYPE_CHECKING:
    from openai import AsyncOpenAI

    from rlcoach import Model, Trajectory

__all__ = ["GroupRunner", "verifiers_client"]


def verifiers_client(client: AsyncOpenAI) -> Any:
    """verifiers' chat-completions client around an OpenAI client of ours."""
    from verifiers.clients import OpenAIChatCompletionsClient

    return OpenAIChatCompletionsClient(client)


class GroupRunner:
    """Runs groups of one environment's rollouts for one model and scores them."""

    def __init__(
        self,
        env: Any,
        model: Model,
        client: AsyncOpenAI,
        sampling_args: dict[str, Any],
        *,
        model_name: str | None = None,
    ) -> None:
        self.env = env
        self.model = model
        self.client = verifiers_client(client)
        self.sampling_args = sampling_args
        self.model_name = model_name
        self._states: dict[str, Any] = {}

    async def attempt(self, row: dict[str, Any]) -> Trajectory:
        """One rollout of `row` inside a scope; its state is kept for the group's scoring."""
        metadata = {"env": str(self.env.env_id), "example_id": str(row.get("example_id", ""))}
        async with self.model.rollout(**metadata) as scope:
            name = self.model_name or self.model.served_name
            state = await self.env.rollout(row, self.client, name, dict(self.sampling_args))
            error = state.get("error")
            if error is not None:
                raise RolloutError(
                    f"environment {self.env.env_id!r}: the rollout of example "
                    f"{metadata['example_id']} ended with {_chain(error)}"
                ) from error
            scope.metadata["turns"] = len(state.get("trajectory") or [])
            scope.metadata["truncated"] = bool(state.get("is_truncated"))
        self._states[scope.trajectory.id] = state
        return scope.trajectory

    async def score(self, group: TrajectoryGroup) -> TrajectoryGroup:
        """The rubric's rewards and metrics on the group (an `after_each` hook)."""
        states = [self._states.pop(t.id) for t in group.trajectories]
        if not states:
            return group
        rubric = self.env.rubric
        try:
            await rubric.score_group(states)
        except Exception as e:
            failure = RolloutFailure(
                type="RolloutError",
                message=f"environment {self.env.env_id!r}: its rubric raised "
                f"{type(e).__name__}: {e}",
                traceback="".join(traceback.format_exception(e)),
            )
            return group.model_copy(
                update={"trajectories": [], "failures": [*group.failures] + [failure] * len(states)}
            )
        finally:
            for state in states:
                await rubric.cleanup(state)
        kept, failed = [], list(group.failures)
        for trajectory, state in zip(group.trajectories, states, strict=True):
            nan = _nan_problem(state)
            if nan:
                failed.append(
                    RolloutFailure(
                        type="RolloutError",
                        message=f"environment {self.env.env_id!r}: {nan}; fix the reward "
                        "function (a reward must be a finite number)",
                    )
                )
                continue
            trajectory.reward = float(state["reward"])
            trajectory.metrics.update(
                {k: float(v) for k, v in (state.get("metrics") or {}).items()}
            )
            kept.append(trajectory)
        return group.model_copy(update={"trajectories": kept, "failures": failed})

    async def groups(
        self, rows: list[dict[str, Any]], group_size: int, *, progress: bool = False
    ) -> list[TrajectoryGroup]:
        """`group_size` scored rollouts of each row."""
        return await gather_trajectory_groups(
            ([self.attempt(row) for _ in range(group_size)] for row in rows),
            after_each=self.score,
            max_failure_fraction=1.0,  # failures are counted; the loop decides what is too many
            progress=progress,
            description=f"{self.env.env_id} rollouts",
        )


def _chain(error: BaseException) -> str:
    """`Error(message) -> Cause(message) ...`: verifiers wraps a client's error in its own."""
    parts = []
    seen: BaseException | None = error
    while seen is not None and len(parts) < 5:
        parts.append(f"{type(seen).__name__}({str(seen)!r})" if str(seen) else type(seen).__name__)
        seen = seen.__cause__ or seen.__context__
    return " -> ".join(parts)


def _nan_problem(state: Any) -> str | None:
    metrics = state.get("metrics") or {}
    bad = sorted(name for name, value in metrics.items() if not math.isfinite(float(value)))
    if bad:
        return f"reward function(s) {', '.join(bad)} returned NaN or infinity"
    reward = state.get("reward")
    if reward is None or not math.isfinite(float(reward)):
        return f"the rubric's reward is {reward!r}"
    return None
