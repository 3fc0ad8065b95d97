"""A trajectory's policy and tool calls, lined up in order with their prompts and times."""

from rlcoach import History, SampledChoice, Trajectory
from rlcoach.trajectory.timeline import PolicyCall, ToolCall, timeline
from rlcoach.trajectory.trajectories import tool_message

CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}
BAD = {"id": "c2", "type": "function", "function": {"name": "add", "arguments": "{oops"}}


def _choice(message, start=None, latency=None):
    return SampledChoice(
        message=message,
        prompt_token_ids=[1, 2],
        token_ids=[3, 4],
        logprobs=[-0.1, -0.2],
        policy="agent@2",
        started_at=start,
        latency_s=latency,
    )


def test_calls_prompts_tools_and_times():
    demo = {"role": "assistant", "content": "It is 5."}  # a worked example in the prompt
    first = {"role": "assistant", "content": None, "tool_calls": [CALL, BAD]}
    final = {"role": "assistant", "content": "It is 5."}
    messages = [
        {"role": "system", "content": "add"},
        {"role": "user", "content": "2+3?"},
        demo,
        {"role": "user", "content": "2+3 again?"},
        first,
        tool_message("c2", "the arguments are not JSON", error=True),
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        final,
    ]
    trajectory = Trajectory(
        messages=messages,
        choices=[_choice(first, 100.0, 1.0), _choice(final, 103.0, 0.5)],
        additional_histories=[
            History(
                messages=[
                    {"role": "user", "content": "sum up"},
                    {"role": "assistant", "content": "ok"},
                ],
                choices=[_choice({"role": "assistant", "content": "ok"})],
            )
        ],
        started_at=99.0,
        finished_at=104.0,
    )
    line = timeline(trajectory)
    assert (line.start, line.end) == (99.0, 104.0)
    main, sub = line.histories
    assert [type(e) for e in main] == [PolicyCall, ToolCall, ToolCall, PolicyCall]
    ask, good, bad, answer = main
    assert ask.prompt == messages[:4] and answer.prompt == messages[:7]  # the demo is prompt
    assert (ask.start, ask.end, answer.start, answer.end) == (100.0, 101.0, 103.0, 103.5)
    assert (good.name, good.arguments, good.result, good.error) == ("add", {"a": 2}, "5", False)
    assert (bad.arguments, bad.result, bad.error) == ("{oops", "the arguments are not JSON", True)
    assert (good.start, good.end) == (101.0, 103.0)  # between the asking reply and the next
    assert sub[0].history == 1 and sub[0].prompt == [{"role": "user", "content": "sum up"}]
    assert sub[0].start == 99.0  # no recorded time: the rollout's start
    assert len(line.policy_calls) == 3 and len(line.tool_calls) == 2


def test_old_files_without_times():
    trajectory = Trajectory(
        messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
        choices=[_choice({"role": "assistant", "content": "yo"})],
    )
    line = timeline(trajectory, now=50.0)
    assert (line.start, line.end) == (50.0, 50.0)
    assert line.policy_calls[0].prompt == [{"role": "user", "content": "hi"}]


def test_a_tool_error_is_the_flag_never_the_wording():
    call = {"role": "assistant", "content": None, "tool_calls": [CALL, BAD, {**CALL, "id": "c3"}]}
    messages = [
        {"role": "user", "content": "2+3?"},
        call,
        tool_message("c1", "error-free result: 5"),  # text that looks like an error is not one
        {"role": "tool", "tool_call_id": "c2", "content": "bad call", "status": "error"},
        tool_message("c3", "the server refused", error=True),
    ]
    trajectory = Trajectory(messages=messages, choices=[_choice(call)])
    assert [c.error for c in timeline(trajectory).tool_calls] == [False, True, True]
    assert tool_message("c3", "x", error=True) == {
        "role": "tool",
        "content": "x",
        "tool_call_id": "c3",
        "is_error": True,
    }
    assert "is_error" not in tool_message("c1", "5")
