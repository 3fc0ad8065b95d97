"""The policy endpoint against a real vLLM server, through the real `openai` client."""

import httpx
import openai
import pytest

from rlcoach.demo.task import ADD_TOOL, Question, _worked_example

pytestmark = pytest.mark.vllm

HELLO = [{"role": "user", "content": "Say hello."}]


async def test_completions_carry_token_ids_and_logprobs_when_asked(policy):
    client = policy.openai_client()
    plain = await client.chat.completions.create(
        model=policy.served_name, messages=HELLO, max_tokens=8, temperature=1.0
    )
    assert plain.choices[0].logprobs is None  # not asked: not sent (OpenAI's contract)
    assert plain.choices[0].model_extra["token_ids"]
    reply = await client.chat.completions.create(
        model=policy.served_name, messages=HELLO, max_tokens=8, temperature=1.0, logprobs=True
    )
    assert reply.model == "calc@0"
    data = reply.model_dump()
    choice = data["choices"][0]
    assert len(data["prompt_token_ids"]) > 5
    assert 1 <= len(choice["token_ids"]) <= 8
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
    assert all(entry["logprob"] <= 0.0 for entry in choice["logprobs"]["content"])


async def test_a_rollout_records_the_exact_sampled_tokens(policy):
    client = policy.openai_client()
    async with policy.rollout(task="hello") as rollout:
        reply = await client.chat.completions.create(
            model=policy.served_name, messages=HELLO, max_tokens=8
        )
    trajectory = rollout.trajectory
    (choice,) = trajectory.choices
    assert choice.token_ids == reply.model_dump()["choices"][0]["token_ids"]
    assert choice.policy == "calc@0"
    assert trajectory.messages[-1]["content"] == reply.choices[0].message.content
    assert trajectory.metadata == {"task": "hello"}


async def test_tools_come_back_as_parsed_tool_calls(policy):
    """With three worked examples in the prompt the base model calls `add` on about 70% of
    samples at temperature 1 (46 of 64 measured), so 24 samples all missing is ~1e-12."""
    client = policy.openai_client()
    found = []
    for question in [Question(12, 30), Question(205, 311), Question(40, 2)]:
        reply = await client.chat.completions.create(
            model=policy.served_name,
            tools=[ADD_TOOL],
            temperature=1.0,
            max_tokens=48,
            n=8,
            messages=[
                *question.messages()[:-1],
                *_worked_example(7, 8, "call_2"),
                question.messages()[-1],
            ],
        )
        assert len(reply.choices) == 8
        found += [call for c in reply.choices for call in c.message.tool_calls or []]
    assert found, "no tool call parsed in 24 samples"
    adds = [c for c in found if c.function.name == "add"]
    assert adds, [c.function.name for c in found]
    call = adds[0]
    assert call.type == "function" and call.id
    assert isinstance(call.function.arguments, str)


async def test_streaming_returns_the_same_text(policy):
    client = policy.openai_client()
    stream = await client.chat.completions.create(
        model=policy.served_name, messages=HELLO, max_tokens=8, temperature=0.0, stream=True
    )
    text = "".join(
        [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
    )
    plain = await client.chat.completions.create(
        model=policy.served_name, messages=HELLO, max_tokens=8, temperature=0.0
    )
    assert text == plain.choices[0].message.content


async def test_models_lists_served_names(policy, vllm_backend):
    async with httpx.AsyncClient(base_url=vllm_backend.url) as http:
        names = [m["id"] for m in (await http.get("/v1/models")).json()["data"]]
        assert "calc@0" in names
        assert (await http.get("/health")).json() == {"status": "ok"}


async def test_unknown_step_is_an_openai_404_naming_the_fix(policy):
    client = policy.openai_client()
    with pytest.raises(openai.NotFoundError) as info:
        await client.chat.completions.create(model="calc@999", messages=HELLO, max_tokens=2)
    message = str(info.value)
    assert "'calc@999'" in message and "fix: use one of" in message and "calc@0" in message


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"model": "calc", "messages": []}, "`messages` must be a non-empty list"),
        ({"model": "calc", "messages": [{"content": "x"}]}, "string `role`"),
        ({"messages": HELLO}, "`model` must be a non-empty string"),
        ({"model": "calc", "messages": HELLO, "tool_choice": "always"}, "'required', 'any'"),
        ({"model": "calc", "messages": HELLO, "n": 0}, "positive integer"),
    ],
)
async def test_malformed_requests_are_openai_400s(vllm_backend, policy, body, expected):
    async with httpx.AsyncClient(base_url=vllm_backend.url) as http:
        response = await http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert expected in error["message"]
    assert error["type"] == "invalid_request_error"


async def test_invalid_json_is_a_400(vllm_backend):
    async with httpx.AsyncClient(base_url=vllm_backend.url) as http:
        response = await http.post(
            "/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"}
        )
    assert response.status_code == 400
    assert "not valid JSON" in response.json()["error"]["message"]


async def test_engine_errors_pass_through_as_openai_errors(policy):
    """vLLM's own validation (a prompt beyond max_model_len) reaches the client as a 400."""
    client = policy.openai_client()
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(
            model=policy.served_name,
            max_tokens=4,
            messages=[{"role": "user", "content": "word " * 6000}],
        )
