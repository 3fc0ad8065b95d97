"""Rewards for MCP rollouts from RULER: the judge compares a group's attempts, with the
server's tools in its context, and its score is blended with the rollout's check.

    gather_trajectory_groups(..., after_each=ruler_rewards(judge, tools, weight=0.5))

`weight` is the judge's share: 1.0 is the judge alone, 0.0 the check alone. The judge
sees the system prompt and the conversation from the task on; a worked example in the
prompt (`build_demonstration`) is left out so it is not mistaken for the attempt. When
the judge fails, the group keeps its check rewards and the failure is counted
(`ruler_failed` in the group's metadata, the error in each trajectory's `verdicts`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from rlcoach.errors import ConfigError
from rlcoach.integrations.mcp.tools import ToolSet
from rlcoach.ruler import JudgeError, JudgeUsage, RulerConfig, score
from rlcoach.types import Message, Trajectory, TrajectoryGroup, Verdict

if TYPE_CHECKING:
    from rlcoach.gather import AfterEach
    from rlcoach.model import Model

__all__ = ["TOOL_USE_RUBRIC", "judged_messages", "ruler_rewards"]

logger = logging.getLogger(__name__)

TOOL_USE_RUBRIC = """\
The assistant serves the user's request with the tools listed.
- Best: it calls the tools that the request needs with correct arguments, uses what they \
return, and gives a final answer that is correct and supported by the tool results.
- Worse: it gets there with unnecessary, failed or repeated calls, or its answer is \
incomplete.
- Worse still: it answers without the tools it needed, or contradicts their results.
- Worst: malformed or irrelevant calls, no answer, or invented facts."""


def judged_messages(trajectory: Trajectory) -> list[Message]:
    """The conversation the judge reads: the system prompt, then the task onwards."""
    skip = int(trajectory.metadata.get("prompt_messages", 0) or 0)
    messages = trajectory.messages
    head = messages[:1] if messages and messages[0].get("role") == "system" else []
    return [*head, *messages[max(skip, len(head)) :]]


def ruler_rewards(
    judge: Model,
    tools: ToolSet,
    *,
    weight: float = 0.5,
    rubric: str = TOOL_USE_RUBRIC,
    config: RulerConfig | dict[str, Any] | None = None,
) -> AfterEach:
    """An `after_each` hook: reward = weight * judge + (1 - weight) * check."""
    if not 0.0 <= weight <= 1.0:
        raise ConfigError(
            f"weight={weight!r} is outside [0, 1]: it is the judge's share of the reward; "
            "fix: pass a weight from 0 (the check alone) to 1 (the judge alone)"
        )

    async def hook(group: TrajectoryGroup) -> TrajectoryGroup:
        scored = group.model_copy(deep=True)
        if len(scored.trajectories) < 2:
            return scored
        usage = JudgeUsage()
        try:
            results = await score(
                [judged_messages(t) for t in scored.trajectories],
                judge,
                rubric=rubric,
                tools=tools.tools,
                config=config,
                usage=usage,
            )
        except JudgeError as e:
            logger.warning("RULER could not score a group (%s); keeping the check rewards", e)
            scored.metadata.update(
                {**usage.as_metrics("ruler_"), "ruler_failed": True, "ruler_error": str(e)}
            )
            for trajectory in scored.trajectories:
                trajectory.verdicts.append(Verdict(judge="ruler", error=f"{e}; check reward kept"))
            return scored
        for trajectory, result in zip(scored.trajectories, results, strict=True):
            check = trajectory.reward
            trajectory.metrics["ruler_score"] = result.score
            trajectory.reward = weight * result.score + (1.0 - weight) * check
            trajectory.verdicts.append(
                Verdict(judge="ruler", score=result.score, explanation=result.explanation)
            )
        scored.metadata.update({**usage.as_metrics("ruler_"), "ruler_failed": False})
        return scored

    return hook
