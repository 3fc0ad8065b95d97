"""Rewards for MCP rollouts: the grounded check, and RULER blended with any check.

`grounded_check(run)` scores a rollout of a grounded scenario (`autorl.grounded`) with
no judge: 0.2 for calling the tool the recorded call used, 0.2 more when such a call
worked (its arguments passed the schema and the server), and 0.6 times the fraction of
the answer key's facts (numbers, names, times, normalised; `autorl.facts`) that the
final answer states. When the policy made the recorded call itself (same arguments) and
its answer no longer states the key's facts, the facts come from the answer it got, so a
result that changes with time (a clock) is checked against what the server said in
this rollout. Success is a score of 1. A
scenario without an answer key (written by a generator) falls back to `tool_use_check`.

RULER: the judge compares a group's attempts, with the
server's tools in its context, and its score is blended with the rollout's check.

    gather_trajectory_groups(..., after_each=ruler_rewards(judge, tools, weight=0.5))

`weight` is the judge's share: 1.0 is the judge alone, 0.0 the check alone. The judge
sees the system prompt and the conversation from the task on; a worked example in the
prompt (`build_demonstration`) is left out so it is not mistaken for the attempt. When
the judge fails, the group keeps its check rewards and the failure is counted
(`ruler_failed` in the group's metadata, the error in each trajectory's `verdicts`).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from rlcoach.autorl.dedupe import normalize_text
from rlcoach.autorl.facts import Fact, fact_found, facts_score, key_facts
from rlcoach.errors import ConfigError
from rlcoach.integrations.mcp.agent import AgentRun, tool_use_check
from rlcoach.integrations.mcp.tools import ToolSet
from rlcoach.ruler import JudgeError, JudgeUsage, RulerConfig, score
from rlcoach.trajectory.trajectories import Message, Trajectory, TrajectoryGroup, Verdict

if TYPE_CHECKING:
    from rlcoach.model import Model
    from rlcoach.rollout.gather import AfterEach

__all__ = ["TOOL_USE_RUBRIC", "grounded_check", "judged_messages", "ruler_rewards"]

logger = logging.getLogger(__name__)

TOOL_USE_RUBRIC = """\
The assistant serves the user's request with the tools listed.
- Best: it calls the tools that the request needs with correct arguments, uses what they \
return, and gives a final answer that is correct and supported by the tool results.
- Worse: it gets there with unnecessary, failed or repeated calls, or its answer is \
incomplete.
- Worse still: it answers without the tools it needed, or contradicts their results.
- Worst: malformed or irrelevant calls, no answer, or invented facts."""


def _normal(value: Any) -> Any:
    if isinstance(value, str):
        return normalize_text(value)
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    return value


def _arguments(raw: str) -> Any:
    try:
        return _normal(json.loads(raw or "{}"))
    except json.JSONDecodeError:
        return None


def grounded_check(run: AgentRun) -> float:
    """The grounded scenario's score in [0, 1] (see the module docstring)."""
    metadata = getattr(run.given, "metadata", None) or {}
    if not isinstance(metadata.get("facts"), str) or "tool" not in metadata:
        return tool_use_check(run)
    facts = [Fact(*item) for item in json.loads(metadata["facts"])]
    expected = _arguments(str(metadata.get("arguments") or "{}"))
    calls = [c for c in run.calls if c.name == metadata["tool"]]
    worked = [c for c in calls if c.outcome == "ok"]
    steps = json.loads(str(metadata.get("steps") or "[]"))
    tools = list(dict.fromkeys(str(s["tool"]) for s in steps)) or [str(metadata["tool"])]
    called = sum(any(c.name == tool for c in run.calls) for tool in tools) / len(tools)
    for call in worked:
        if _arguments(call.arguments) == expected:
            # the same call: when its answer changed (a clock), the facts are its own
            if not all(fact_found(f, call.result) for f in facts):
                live = key_facts(call.result, known=run.scenario, limit=max(len(facts), 1))
                facts = live or facts
            break
    score = 0.2 * called + 0.2 * bool(worked) + 0.6 * facts_score(facts, run.final_answer)
    return round(score, 6)


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
