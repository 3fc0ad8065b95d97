"""Rubrics: what the judge is told a good trajectory is.

The default rubric is task-agnostic; pass your own (a few sentences about what success
means for your task) to `score` / `score_group` when the task has a clear goal.
"""

from __future__ import annotations

__all__ = ["DEFAULT_RUBRIC"]

DEFAULT_RUBRIC = """\
- A trajectory that achieves the user's goal scores higher than one that does not.
- Among trajectories that achieve the goal, prefer the more efficient one (fewer wasted \
steps, tool calls that succeed, no needless repetition).
- A trajectory that makes progress toward the goal scores higher than one that makes none.
- Wrong facts, invented tool results and ignored instructions lower the score.
- Score relative to the other trajectories of the group: the best one should score near 1 \
and the worst near 0, unless they are equally good or equally bad."""
