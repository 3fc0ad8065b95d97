"""What parts tell each other about a rollout travels as fields, never as text to parse:
a judge's `Verdict` on the trajectory, and a tool error flag on the tool message."""

import json

from rlcoach import (
    SampledChoice,
    Trajectory,
    TrajectoryGroup,
    Verdict,
    load_groups,
    save_groups,
    tool_message,
)
from rlcoach.observe.report import _trajectory_html
from rlcoach.trajectory.timeline import timeline

CALL = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}


def _judged() -> Trajectory:
    asked = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    return Trajectory(
        messages=[
            {"role": "user", "content": "find it"},
            asked,
            tool_message("c1", "no such item", error=True),
        ],
        choices=[
            SampledChoice(
                message=asked, prompt_token_ids=[1], token_ids=[2], logprobs=[-0.5], policy="a@1"
            )
        ],
        reward=0.8,
        verdicts=[Verdict(judge="ruler", score=0.8, explanation="looked in the right place")],
        logs=["a note from the rollout"],
    )


def test_verdicts_and_tool_errors_survive_the_disk(tmp_path):
    path = save_groups(tmp_path / "groups.jsonl", [TrajectoryGroup([_judged()])])
    [group] = load_groups(path)
    [trajectory] = group.trajectories
    assert trajectory.verdicts == [
        Verdict(judge="ruler", score=0.8, explanation="looked in the right place")
    ]
    assert trajectory.messages[-1]["is_error"] is True


def test_an_older_run_folder_without_verdicts_still_loads(tmp_path):
    line = _judged().model_dump(exclude={"verdicts"})
    line["logs"] = ["RULER 0.800: looked in the right place"]  # how judges wrote it before
    (tmp_path / "old.jsonl").write_text(json.dumps({"trajectories": [line]}) + "\n")
    [group] = load_groups(tmp_path / "old.jsonl")
    assert group.trajectories[0].verdicts == []
    page = _trajectory_html(0, 0.5, group.trajectories[0], None)
    assert "RULER 0.800: looked in the right place" in page  # shown with the logs


def test_the_report_shows_the_verdict_as_the_judge_and_flags_the_failed_call():
    page = _trajectory_html(0, 0.5, _judged(), None)
    judge = page.split("<div class='judge'>")[1].split("</div>")[0]
    assert "ruler 0.800: looked in the right place" in judge
    logs = page.split("<div class='logs'>")[1].split("</div>")[0]
    assert "a note from the rollout" in logs and "ruler" not in logs
    assert [c.error for c in timeline(_judged()).tool_calls] == [True]
    assert "<li class='err'><code>lookup(" in page


def test_a_verdict_without_a_score_says_why():
    failed = Verdict(judge="ruler", error="the judge timed out; reward kept")
    assert failed.describe() == "ruler gave no score: the judge timed out; reward kept"
    assert Verdict(judge="mine", score=1.0).describe() == "mine 1.000"
