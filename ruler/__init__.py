"""RULER: group-relative LLM-judge rewards (`rlcoach.ruler`). Imports only `rlcoach`.

A judge model (any OpenAI-compatible endpoint, given as a `Model`: a hosted API, a local
vLLM server, or the policy endpoint itself) compares the attempts of one group and
scores each from 0 to 1. GRPO only needs the relative order within a group, so a judge
that ranks well is reward enough — no labels, no hand-written reward function.
"""

from rlcoach.ruler.config import RulerConfig
from rlcoach.ruler.judge import JudgeError
from rlcoach.ruler.render import Candidate, render_group
from rlcoach.ruler.rubric import DEFAULT_RUBRIC
from rlcoach.ruler.score import after_each, judge_usage, score, score_candidates, score_group
from rlcoach.ruler.types import JudgeScore, JudgeUsage

__all__ = [
    "DEFAULT_RUBRIC",
    "Candidate",
    "JudgeError",
    "JudgeScore",
    "JudgeUsage",
    "RulerConfig",
    "after_each",
    "judge_usage",
    "render_group",
    "score",
    "score_candidates",
    "score_group",
]
