"""Sampling constraints and streamed completions, on payloads shaped as vLLM 0.32 sends them."""

import json

import pytest

from rlcoach.endpoint.constraint import (
    as_asked,
    forced_positions,
    normalize_tool_choice,
    sampling_constraint,
    tool_choice_problem,
)
from rlcoach.engines.stream import CompletionAssembler, completion_events

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize(
    ("body", "label"),
    [
        ({}, None),
        ({"tools": TOOLS}, None),
        ({"tools": TOOLS, "tool_choice": "auto"}, None),
        ({"tools": TOOLS, "tool_choice": "required"}, "tool_choice=required"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "add"}}},
            "tool_choice=add",
        ),
        ({"tools": [{**TOOLS[0], "strict": True}]}, "strict_tools"),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, "json_schema"),
        ({"response_format": {"type": "json_object"}}, "json_object"),
        ({"response_format": {"type": "text"}}, None),
        ({"structured_outputs": {"regex": "[0-9]+"}}, "regex"),
        ({"structured_outputs": {"json": {"type": "object"}}}, "json_schema"),
        ({"structured_outputs": {"choice": ["a", "b"]}}, "choice"),
        ({"guided_grammar": "root ::= 'x'"}, "grammar"),
    ],
)
def test_which_requests_sample_under_a_constraint(body, label):
    assert sampling_constraint(body) == label


def test_tool_choice_any_is_required_and_bad_values_name_the_valid_ones():
    assert normalize_tool_choice({"tool_choice": "any"})["tool_choice"] == "required"
    assert tool_choice_problem("required") is None
    assert tool_choice_problem({"type": "function", "function": {"name": "add"}}) is None
    problem = tool_choice_problem("always")
    assert "'always'" in problem and "'any'" in problem and "fix:" in problem


def entry(token, logprob, runner_up):
    # vLLM lists the sampled token first, then the best other one
    return {
        "token": token,
        "logprob": logprob,
        "top_logprobs": [
            {"token": token, "logprob": logprob},
            {"token": "x", "logprob": runner_up},
        ],
    }


def test_forced_positions_are_those_whose_runner_up_was_masked():
    choice = {
        "logprobs": {
            "content": [
                entry("{", 0.0, -9999.0),  # only '{' allowed
                entry("happy", -0.4, -1.2),  # a real choice
                entry("sad", -2.0, -0.3),  # sampled below the best: not forced
                entry("}", 0.0, -9999.0),
            ]
        }
    }
    assert forced_positions(choice) == [0, 3]
    trimmed = as_asked({"choices": [choice]}, {"logprobs": True})
    assert all(e["top_logprobs"] == [] for e in trimmed["choices"][0]["logprobs"]["content"])
    assert len(choice["logprobs"]["content"][0]["top_logprobs"]) == 2  # the original is kept
    assert as_asked({"choices": [choice]}, {})["choices"][0]["logprobs"] is None


def test_streamed_chunks_add_up_to_the_completion():
    completion = {
        "id": "c1",
        "created": 1,
        "model": "p@0",
        "prompt_token_ids": [1, 2],
        "usage": {"total_tokens": 5},
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Hi",
                    "tool_calls": [
                        {
                            "id": "t1",
                            "type": "function",
                            "function": {"name": "add", "arguments": '{"a": 1}'},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
                "token_ids": [7, 8, 9],
                "logprobs": {"content": [{"logprob": -0.1}, {"logprob": -0.2}, {"logprob": 0.0}]},
            }
        ],
    }
    assembler = CompletionAssembler()
    for event in completion_events(completion, include_usage=True):
        data = event[len(b"data: ") :].strip()
        if data != b"[DONE]":
            assembler.add(json.loads(data))
    assert assembler.finished
    rebuilt = assembler.completion()
    choice = rebuilt["choices"][0]
    assert choice["token_ids"] == [7, 8, 9] and choice["finish_reason"] == "tool_calls"
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == [-0.1, -0.2, 0.0]
    assert choice["message"]["content"] == "Hi"
    assert choice["message"]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'
    assert rebuilt["prompt_token_ids"] == [1, 2] and rebuilt["usage"] == {"total_tokens": 5}
