"""Tool-call parsing of the bundled template's Hermes `<tool_call>` blocks."""

import json

from rlcoach.models.chat_template import parse_tool_calls


def test_calls_are_parsed_and_removed_from_the_text():
    text = 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "Sure."
    assert len(calls) == 1
    assert calls[0]["function"]["name"] == "add"
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 1, "b": 2}
    assert calls[0]["id"].startswith("call_")


def test_two_calls_and_string_arguments():
    text = (
        '<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>'
        '<tool_call>{"name": "b", "parameters": {"y": 2}}</tool_call>'
    )
    content, calls = parse_tool_calls(text)
    assert content is None
    assert [c["function"]["name"] for c in calls] == ["a", "b"]
    assert calls[0]["function"]["arguments"] == '{"x": 1}'
    assert json.loads(calls[1]["function"]["arguments"]) == {"y": 2}


def test_malformed_blocks_stay_in_the_text():
    text = "<tool_call>{not json}</tool_call> and <tool_call>[1, 2]</tool_call>"
    content, calls = parse_tool_calls(text)
    assert calls == []
    assert content == text
