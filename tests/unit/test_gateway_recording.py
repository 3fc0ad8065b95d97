"""What the policy endpoint records for a constrained completion: the unit test that would
have caught issue 24's `mean_ratio 0.923`.

vLLM reports a constrained token's log-prob after its grammar mask (0.0 where the
grammar allowed one token), while the trainer recomputes the model's own. The gateway
must record the model's own log-probs and mark the forced positions. The engine here
replays, at the `Engine` protocol seam, a JSON-schema completion and a forced tool call
captured from the real vLLM 0.32 server with the bundled model (`gateway_vllm.json`:
the completions as vLLM returned them, and the model's own log-probs of the sampled
tokens from the same server's prompt log-probs, and the text of the sampled call from its
detokenizer) — a vLLM start takes 40-60 s, too long for a unit test; the real server runs
the same paths in test_capture_ratio.py. The gateway, its HTTP server and the OpenAI
client are real.
"""

import copy
import json
import math
from pathlib import Path

import pytest

from rlcoach.endpoint.gateway import ROLLOUT_HEADER, Gateway
from rlcoach.endpoint.router import Router
from rlcoach.engines.stream import completion_events

CAPTURED = json.loads((Path(__file__).with_name("gateway_vllm.json")).read_text())
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
SCHEMA = {"type": "json_schema", "json_schema": {"name": "mood", "schema": {"type": "object"}}}


class ReplayEngine:
    """The engine protocol, answering with the captured vLLM responses."""

    base_name = "smollm2-135m-instruct"

    def __init__(self) -> None:
        self.bodies: list[dict] = []

    async def chat(self, body: dict) -> dict:
        self.bodies.append(body)
        kind = "required" if body.get("tool_choice") else "json_schema"
        return copy.deepcopy(CAPTURED[kind]["response"])

    async def chat_stream(self, body: dict):
        self.bodies.append(body)
        for event in completion_events(copy.deepcopy(CAPTURED["json_schema"]["response"]), False):
            if event.startswith(b"data: {"):
                yield json.loads(event[len(b"data: ") :])

    async def token_logprobs(self, model: str, token_ids: list[int], start: int) -> list[float]:
        for captured in CAPTURED.values():
            response = captured["response"]
            prompt = response["prompt_token_ids"]
            if token_ids == [*prompt, *response["choices"][0]["token_ids"]]:
                assert start == len(prompt)
                return captured["free_logprobs"]
        raise AssertionError("re-scored tokens that were not sampled")

    async def detokenize(self, model: str, token_ids: list[int]) -> str:
        captured = CAPTURED["required"]
        assert token_ids == captured["response"]["choices"][0]["token_ids"][:-1]  # no end
        return captured["text"]

    async def healthy(self) -> bool:
        return True


@pytest.fixture
def gateway():
    engine = ReplayEngine()
    served = Gateway(engine, Router(engine, max_loras=2))
    served.start()
    yield served
    served.stop()


@pytest.mark.parametrize(
    ("kind", "extra", "constraint"),
    [
        ("json_schema", {"response_format": SCHEMA}, "json_schema"),
        ("required", {"tools": TOOLS, "tool_choice": "any"}, "tool_choice=required"),
    ],
)
async def test_a_constrained_completion_is_recorded_with_the_models_own_logprobs(
    gateway, kind, extra, constraint
):
    import openai

    client = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0)
    reply = await client.chat.completions.create(
        model=ReplayEngine.base_name,
        messages=[{"role": "user", "content": "What is 2 + 3?"}],
        extra_headers={ROLLOUT_HEADER: "r1"},
        logprobs=True,
        **extra,
    )
    captured = CAPTURED[kind]
    vllm_choice = captured["response"]["choices"][0]
    engine_said = [e["logprob"] for e in vllm_choice["logprobs"]["content"]]
    # what the engine was asked: log-probs, token ids, two candidates per position
    [body] = gateway.engine.bodies
    assert body["logprobs"] and body["return_token_ids"] and body["top_logprobs"] == 2
    assert body.get("tool_choice") in (None, "required")  # LangChain's "any" spelled out
    # the client gets vLLM's answer, with the top log-probs it asked for (none)
    assert [e.logprob for e in reply.choices[0].logprobs.content] == engine_said
    assert all(e.top_logprobs == [] for e in reply.choices[0].logprobs.content)

    [exchange] = gateway.recorder.take("r1")
    assert "rlcoach" not in exchange.response["choices"][0]  # the notes ride beside it
    choice = exchange.sampled(0)
    assert choice.logprobs == captured["free_logprobs"] != engine_said
    assert choice.constraint == constraint
    forced = [i for i, lp in enumerate(engine_said) if lp == 0.0 and i in choice.forced]
    assert choice.forced and forced == choice.forced  # forced: probability 1 under the grammar
    assert len(choice.forced) < len(choice.token_ids)  # the policy chose the rest
    # the constrained log-probs overstate every forced token: the bias the ratio saw
    assert all(captured["free_logprobs"][i] < 0.0 for i in choice.forced)


async def test_a_sampled_tool_call_goes_back_to_the_engine_as_it_was_sampled(gateway):
    """The model spaced its arguments its own way; the parser re-serialised them. When the
    client returns the parsed call, the engine must get the sampled text, or the next
    prompt would not extend the sampled tokens (a second training sequence)."""
    import openai

    client = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0)
    question = [{"role": "user", "content": "What is 2 + 3?"}]
    headers = {ROLLOUT_HEADER: "r2"}
    first = await client.chat.completions.create(
        model=ReplayEngine.base_name,
        messages=question,
        tools=TOOLS,
        tool_choice="required",
        extra_headers=headers,
    )
    [call] = first.choices[0].message.tool_calls
    sampled = CAPTURED["required"]["text"]
    assert call.function.arguments not in sampled  # re-serialised: spacing differs
    follow = [
        *question,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "5"},
    ]
    await client.chat.completions.create(
        model=ReplayEngine.base_name, messages=follow, tools=TOOLS, extra_headers=headers
    )
    upstream = gateway.engine.bodies[1]["messages"]
    assert upstream[1] == {"role": "assistant", "content": sampled}
    assert upstream[0] == question[0] and upstream[2]["role"] == "tool"
    # the client's own messages are what is recorded
    [_, second] = gateway.recorder.take("r2")
    request = second.request
    assert request["messages"][1]["tool_calls"][0]["function"]["arguments"] == (
        call.function.arguments
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_the_client_gets_logprobs_only_when_it_asks_and_the_rollout_always(gateway, stream):
    """The endpoint asks the engine for log-probs on every call (training needs them); a
    client that did not ask gets none (OpenAI's contract, and no parsing of hundreds of
    log-prob objects), but the recorded completion keeps them, and the token ids stay."""
    import openai

    client = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0)
    question = [{"role": "user", "content": "Describe your mood."}]
    vllm_choice = CAPTURED["json_schema"]["response"]["choices"][0]
    for asked in (False, True):
        rollout = f"plain-{stream}-{asked}"
        extra = {"logprobs": True} if asked else {}
        reply = await client.chat.completions.create(
            model=ReplayEngine.base_name,
            messages=question,
            extra_headers={ROLLOUT_HEADER: rollout},
            stream=stream,
            **extra,
        )
        if stream:
            chunks = [chunk async for chunk in reply]
            got = [c.choices[0].logprobs for c in chunks if c.choices]
            received = [e.logprob for lp in got if lp for e in lp.content or []]
            assert all(lp is None for lp in got) != asked
        else:
            logprobs = reply.choices[0].logprobs
            assert (logprobs is None) != asked
            received = [e.logprob for e in logprobs.content] if logprobs else []
            assert reply.choices[0].model_extra["token_ids"] == vllm_choice["token_ids"]
        engine_said = [e["logprob"] for e in vllm_choice["logprobs"]["content"]]
        assert received == (engine_said if asked else [])
        [exchange] = gateway.recorder.take(rollout)
        response = exchange.response
        recorded = exchange.sampled(0)
        assert recorded.logprobs == engine_said and recorded.token_ids == vllm_choice["token_ids"]
        assert response["model"] == ReplayEngine.base_name


async def test_an_evaluation_rollouts_constrained_reply_is_kept_as_sampled_and_untrained(
    gateway, monkeypatch
):
    """Held-out rollouts are measured, never trained: the gateway skips the re-scoring (a
    prompt pass of its own) and marks every position forced, so no token can be trained;
    `model.rollout(evaluation=True)` makes the model's clients say so."""
    import httpx
    import openai

    from rlcoach.endpoint.gateway import EVALUATION_HEADER
    from rlcoach.model import _tag_rollout_sync
    from rlcoach.rollout.scope import Rollout
    from rlcoach.trainer.sequences import build_sequences
    from rlcoach.trajectory.trajectories import Trajectory

    class Source:
        async def take_exchanges(self, rollout_id):
            return []

    for evaluation in (True, False):
        async with Rollout(Source(), evaluation=evaluation, task="t"):
            request = httpx.Request("POST", "http://x/v1/chat/completions")
            _tag_rollout_sync(request)
        assert (request.headers.get(EVALUATION_HEADER) == "1") is evaluation
        assert ROLLOUT_HEADER in request.headers

    async def never(*args):
        raise AssertionError("an evaluation's reply was re-scored")

    monkeypatch.setattr(gateway.engine, "token_logprobs", never)
    client = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0)
    await client.chat.completions.create(
        model=ReplayEngine.base_name,
        messages=[{"role": "user", "content": "What is 2 + 3?"}],
        extra_headers={ROLLOUT_HEADER: "e1", EVALUATION_HEADER: "1"},
        tools=TOOLS,
        tool_choice="required",
    )
    [exchange] = gateway.recorder.take("e1")
    choice = exchange.sampled(0)
    sampled = CAPTURED["required"]["response"]["choices"][0]
    assert choice.logprobs == [e["logprob"] for e in sampled["logprobs"]["content"]]
    assert choice.constraint == "tool_choice=required"
    assert choice.forced == list(range(len(choice.token_ids)))
    trajectory = Trajectory(choices=[choice], reward=1.0)
    assert build_sequences(trajectory, 1.0) == []  # nothing of it reaches a trainer


async def test_a_constrained_reply_left_to_the_trainer_is_recorded_without_logprobs(
    gateway, monkeypatch
):
    """Where the engine's prompt pass is slow (vLLM on a CPU: `rescore_alone`, the default
    there), the gateway records a constrained reply with no log-probs and the trainer's
    own stand in (rescore.py): the engine is asked nothing more, the forced positions are
    marked as a re-scoring marks them, the free ones are trained, and the recording
    crosses the wire (`rlcoach serve`) as JSON."""
    import openai

    from rlcoach.trainer.sequences import build_sequences, check_logprobs
    from rlcoach.trajectory.exchange import Exchange
    from rlcoach.trajectory.trajectories import Trajectory

    async def never(*args):
        raise AssertionError("a reply left to the trainer was re-scored by the engine")

    monkeypatch.setattr(gateway.engine, "token_logprobs", never)
    gateway.constrained_logprobs = "trainer"
    client = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0)
    await client.chat.completions.create(
        model=ReplayEngine.base_name,
        messages=[{"role": "user", "content": "What is 2 + 3?"}],
        extra_headers={ROLLOUT_HEADER: "t1"},
        tools=TOOLS,
        tool_choice="required",
    )
    [exchange] = gateway.recorder.take("t1")
    exchange = Exchange.from_wire(json.loads(json.dumps(exchange.as_wire(), allow_nan=False)))
    choice = exchange.sampled(0)
    engine_said = [
        e["logprob"] for e in CAPTURED["required"]["response"]["choices"][0]["logprobs"]["content"]
    ]
    assert len(choice.logprobs) == len(choice.token_ids) == len(engine_said)
    assert all(math.isnan(x) for x in choice.logprobs)
    assert choice.constraint == "tool_choice=required" and choice.logprobs_may_be_unknown
    assert choice.forced and choice.forced == [i for i, lp in enumerate(engine_said) if lp == 0.0]
    trajectory = Trajectory(choices=[choice], reward=1.0)
    check_logprobs(trajectory)  # NaN is allowed here, and nowhere a sampler recorded
    [sequence] = build_sequences(trajectory, 1.0)
    trained = sequence.sampled_mask[-len(choice.token_ids) :]
    assert trained == [0 if i in choice.forced else 1 for i in range(len(choice.token_ids))]
