"""The policy endpoint keeps OpenAI's promises on forced tool calls and JSON modes (issue
42), with the real vLLM engine and the bundled 135M model behind it (the session's).

Without the endpoint's grammar this model, asked for a forced call, writes arguments that
miss required keys or runs to `max_tokens` inside a call (bench/forced_calls.py: 28 of 100
valid through vLLM directly); here every forced reply must be a call whose arguments fit
the schema, closed within `max_tokens` (call_budget.py bounds what could run on).
Sampling is at temperature 1.0 with several choices a request, so the
grammar, not luck, has to hold them. Nothing is faked.
"""

import json
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel
from tool_schemas import SCHEMAS, tool

from rlcoach.demo.task import Question, _worked_example
from rlcoach.integrations.langgraph import chat_model

pytestmark = pytest.mark.vllm

ADD, WEATHER = tool("add"), tool("get_weather")
ASK = [{"role": "user", "content": "What is 2 + 3? And is it warm in Lisbon? Use the tools."}]


def fitting_calls(choice) -> list[str]:
    """The names of a choice's calls, each checked against its tool's schema."""
    calls = choice.message.tool_calls or []
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    return [call.function.name for call in calls]


def named(tool: str) -> dict:
    return {"type": "function", "function": {"name": tool}}


async def ask(policy, tool_choice, **options):
    """ASK with the two tools offered, under `tool_choice`, through the policy endpoint."""
    return await policy.openai_client().chat.completions.create(
        model=policy.name, messages=ASK, tools=[ADD, WEATHER], tool_choice=tool_choice, **options
    )


async def test_required_always_calls_with_fitting_arguments(policy):
    async with policy.rollout() as scope:
        reply = await ask(policy, "required", max_tokens=96, n=6, temperature=1.0)
    for choice in reply.choices:
        # every reply closes within max_tokens (call_budget.py), with calls that fit
        assert choice.finish_reason == "tool_calls" and fitting_calls(choice), choice
        assert choice.message.content is None
    assert any(choice.message.tool_calls for choice in reply.choices)
    # recorded as a constrained choice, with what the grammar forced kept out of the loss
    trajectory = scope.trajectory  # one history per choice of the n
    recorded = [c for h in (trajectory, *trajectory.additional_histories) for c in h.choices]
    assert [c.constraint for c in recorded] == ["tool_choice=required"] * 6
    assert all(c.forced and len(c.forced) < len(c.token_ids) for c in recorded)


async def test_required_with_one_call_only(policy):
    reply = await ask(
        policy, "required", parallel_tool_calls=False, max_tokens=96, n=4, temperature=1.0
    )
    for choice in reply.choices:
        assert len(fitting_calls(choice)) == 1 and choice.finish_reason == "tool_calls", choice


async def test_a_named_tool_is_the_one_called(policy):
    reply = await ask(policy, named("get_weather"), max_tokens=96, n=6, temperature=1.0)
    for choice in reply.choices:
        assert fitting_calls(choice) == ["get_weather"], choice
        assert choice.finish_reason == "stop"  # OpenAI's finish for a named tool choice


async def test_without_max_tokens_the_call_is_bounded_by_the_contexts_room(policy):
    reply = await ask(policy, named("add"), n=2, temperature=1.0)
    for choice in reply.choices:
        assert fitting_calls(choice) == ["add"] and choice.finish_reason == "stop", choice


async def test_a_budget_too_small_for_any_call_is_cut_and_says_so(policy):
    reply = await ask(policy, named("get_weather"), max_tokens=8)  # not even the envelope fits
    [choice] = reply.choices
    assert choice.finish_reason == "length" and not choice.message.tool_calls
    assert choice.message.content  # the cut text, as OpenAI keeps it


async def test_a_streamed_forced_call_arrives_as_tool_call_deltas(policy):
    async with policy.rollout() as scope:
        stream = await ask(policy, named("add"), max_tokens=64, stream=True)
        chunks = [chunk async for chunk in stream]
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or []) if c.choices]
    assert len(deltas) == 1 and deltas[0].function.name == "add"
    jsonschema.validate(json.loads(deltas[0].function.arguments), SCHEMAS["add"])
    assert not any(c.choices and c.choices[0].delta.content for c in chunks)
    [recorded] = scope.trajectory.choices
    assert recorded.message["tool_calls"][0]["id"] == deltas[0].id


async def test_strict_tools_hold_every_call_the_model_makes(policy):
    """`strict` without a forced choice: the model may answer in text, but a call it makes
    fits the schema (the endpoint's grammar, triggered by the envelope's opening). A
    worked example in the prompt makes this model call on most samples."""
    client = policy.openai_client()
    strict = {**ADD, "function": {**ADD["function"], "strict": True}}
    question = Question(12, 30)
    reply = await client.chat.completions.create(
        model=policy.name,
        messages=[
            *question.messages()[:-1],
            *_worked_example(7, 8, "call_2"),
            question.messages()[-1],
        ],
        tools=[strict],
        max_tokens=64,
        n=8,
        temperature=1.0,
    )
    called = [name for choice in reply.choices for name in fitting_calls(choice)]
    assert called, [c.message.content for c in reply.choices]
    for choice in reply.choices:  # no call left unparsed in the text
        assert "<tool_call>" not in (choice.message.content or ""), choice


class Verdict(BaseModel):
    sentiment: Literal["positive", "negative", "neutral"]
    stars: int


REVIEWS = ("Great kettle, fast and quiet.", "The lamp broke in a day.")


async def test_langchain_with_structured_output_by_function_calling(policy):
    """A forced call (LangChain's function-calling method) always comes back, and fits."""
    llm = chat_model(policy, max_tokens=96).with_structured_output(
        Verdict, method="function_calling"
    )
    verdicts = [await llm.ainvoke(f"Review: {review}. Rate it.") for review in REVIEWS]
    assert all(isinstance(v, Verdict) for v in verdicts), verdicts


async def test_langchain_with_structured_output_by_json_schema(policy):
    """The JSON-schema method gets OpenAI's promise: a reply that stops parses into the
    schema; one that `max_tokens` cuts says so (`finish_reason="length"`, which LangChain
    raises as `LengthFinishReasonError`), never an unparseable reply that claims to stop."""
    llm = chat_model(policy, max_tokens=96).with_structured_output(
        Verdict, method="json_schema", include_raw=True
    )
    for review in REVIEWS:
        try:
            answer = await llm.ainvoke(f"Review: {review}. Rate it.")
        except openai.LengthFinishReasonError:
            continue  # cut by max_tokens, and said so
        finish = answer["raw"].response_metadata.get("finish_reason")
        assert finish == "stop", answer
        assert answer["parsing_error"] is None and isinstance(answer["parsed"], Verdict), answer


async def test_json_object_replies_parse_whenever_they_stop(policy):
    client = policy.openai_client()
    reply = await client.chat.completions.create(
        model=policy.name,
        messages=[{"role": "user", "content": "Describe a cat as a JSON object."}],
        response_format={"type": "json_object"},
        max_tokens=200,
        n=6,
        temperature=1.0,
    )
    finishes = [choice.finish_reason for choice in reply.choices]
    assert set(finishes) <= {"stop", "length"}
    for choice in reply.choices:
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content), dict)
    # Three tokens: an object closes early ("{}" and stop) or is cut, and says so (as
    # OpenAI does); either way no reply claims to stop with unparseable JSON.
    cut = await client.chat.completions.create(
        model=policy.name,
        messages=[{"role": "user", "content": "Describe a cat as a JSON object."}],
        response_format={"type": "json_object"},
        max_tokens=3,
        n=4,
        temperature=1.0,
    )
    for choice in cut.choices:
        try:
            parsed = json.loads(choice.message.content)
        except json.JSONDecodeError:
            assert choice.finish_reason == "length", choice
        else:
            assert choice.finish_reason == "stop" and isinstance(parsed, dict), choice


RECURSIVE = {
    "type": "object",
    "properties": {"tree": {"$ref": "#/$defs/Node"}},
    "$defs": {
        "Node": {
            "type": "object",
            "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
        }
    },
}


@pytest.mark.parametrize(
    ("tools", "choice", "expected"),
    [
        ([ADD], {"type": "function", "function": {"name": "mul"}}, ["'mul'", "'add'"]),
        (
            [{"type": "function", "function": {"name": "plant", "parameters": RECURSIVE}}],
            "required",
            ["'plant'", "`$ref`", "recursive"],
        ),
        (
            [
                {
                    "type": "function",
                    "function": {
                        "name": "pick",
                        "strict": True,
                        "parameters": {"type": "object", "properties": {"n": {"not": {}}}},
                    },
                }
            ],
            "auto",
            ["'pick'", "`not`", "#/properties/n"],
        ),
    ],
)
async def test_bad_tools_are_400s_before_sampling(vllm_backend, policy, tools, choice, expected):
    body = {"model": policy.name, "messages": ASK, "tools": tools, "tool_choice": choice}
    async with httpx.AsyncClient(base_url=vllm_backend.url) as http:
        response = await http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert all(part in error["message"] for part in expected), error["message"]
    assert error["type"] == "invalid_request_error"
