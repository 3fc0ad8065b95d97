"""The first on-policy step on every capture path trains the tokens the policy chose, at
the probability it had (issue 24).

On-policy, the trainer's log-prob of each trained token must equal the sampler's, so the
step's mean ratio exp(new - old) is 1 up to numerics: within four standard errors of
the step's own per-token mismatch, at least 0.01 and at most 0.03 (tests/on_policy.py).
Under bf16 autocast the trainer's log-prob of a token differs from vLLM's by about 0.05
on average, so each path samples about 100 tokens or more. Each test samples through
one capture path with the real vLLM engine behind the policy endpoint (the session's),
trains one step on it, and checks that ratio: the plain OpenAI client, a stream, a JSON
schema, a forced tool call, a LangGraph app with a router, a ReAct sub-graph and a
summariser sub-agent, the MCP agent, and a forced call whose log-probs the endpoint left
to the trainer (`RemoteBackend` is checked in
test_serve_vllm.py, on that module's server). Each step samples from the adapter the
step before published, so every one is a first step for the data it trains on.
`pytest -s` prints each path's ratio (the table in docs/capture.md).

Nothing is faked. The 135M model rarely calls a tool on its own, so the tool paths force
the call the way users do (`tool_choice="required"`, LangChain's `"any"`): the endpoint
must then record the grammar's tokens as forced and leave them out of the loss.
"""

import json
from typing import Literal

import pytest
import torch
from on_policy import ratio_tolerance
from pydantic import BaseModel
from shop_app import build_app, shop_tools
from tool_schemas import tool

from rlcoach import TrainableModel, TrajectoryGroup
from rlcoach.integrations.langgraph import chat_model, rollout_fn
from rlcoach.trainer.objective import policy_loss
from rlcoach.trainer.sequences import build_sequences, pack_sequences

pytestmark = pytest.mark.vllm

# Schema-true arguments for the follow-up turn too: a `strict` tool (without it vLLM lets
# a call there be any JSON, and the 135M model writes a schema until max_tokens cuts it).
ADD = tool("add", strict=True)
QUESTION = [{"role": "user", "content": "What is 2 + 3? Use the add tool."}]


@pytest.fixture(scope="module")
async def policy(vllm_backend):
    model = TrainableModel("on-policy", "integration", config={"learning_rate": 1e-4})
    await model.register(vllm_backend)
    # The paths below check what the endpoint records against the trainer, so constrained
    # replies are re-scored by the engine (a GPU's default); a CPU engine leaves them to
    # the trainer by default, checked by its own test at the end.
    gateway = vllm_backend.gateway
    default, gateway.constrained_logprobs = gateway.constrained_logprobs, "engine"
    yield model
    gateway.constrained_logprobs = default


async def first_step(model: TrainableModel, trajectories, path: str) -> dict:
    """One step on these trajectories (rewards made to differ): its stats, ratio checked
    and printed with the mismatch (`pytest -s` shows the table docs/capture.md holds)."""
    for index, trajectory in enumerate(trajectories):
        trajectory.reward = float(index % 2)
    sampled_by = {v for t in trajectories for v in t.policy_versions}
    assert sampled_by == {model.served_name}, "the data must come from the current policy"
    result = await model.train([TrajectoryGroup(trajectories)])
    stats = result.stats.as_dict()
    assert result.stats.trained and stats["sampled_tokens"] > 0
    print(
        f"\nratio | {path} | {stats['mean_ratio']:.4f} | {stats['sampled_tokens']} | "
        f"{stats['mismatch_abs_mean']:.4f} | {stats['mismatch_abs_max']:.3f} |"
    )
    tolerance = ratio_tolerance(stats["mismatch_kl_k3"], stats["sampled_tokens"])
    assert abs(stats["mean_ratio"] - 1.0) <= tolerance, (tolerance, stats)
    return stats


async def test_plain_openai_client(policy):
    client = policy.openai_client()
    trajectories = []
    for topic in ("kettles", "lamps", "kites", "bread"):
        async with policy.rollout() as scope:
            await client.chat.completions.create(
                model=policy.name,
                messages=[{"role": "user", "content": f"Write a line about {topic}."}],
                max_tokens=48,
            )
        trajectories.append(scope.trajectory)
    await first_step(policy, trajectories, "plain OpenAI client")


async def test_a_stream_is_relayed_token_by_token_and_recorded_whole(policy):
    client = policy.openai_client()
    trajectories = []
    for topic in ("tea", "rain", "snow", "maps"):
        async with policy.rollout() as scope:
            stream = await client.chat.completions.create(
                model=policy.name,
                messages=[{"role": "user", "content": f"Write a line about {topic}."}],
                max_tokens=48,
                stream=True,
                stream_options={"include_usage": True},
            )
            pieces = [c.choices[0].delta.content async for c in stream if c.choices]
        text = "".join(p or "" for p in pieces)
        [choice] = scope.trajectory.choices
        # about one event per token (the old endpoint replayed a finished answer as one)
        assert sum(1 for p in pieces if p) > len(choice.token_ids) // 2 > 1
        assert choice.message.get("content", "") == text
        assert len(choice.logprobs) == len(choice.token_ids) and choice.prompt_token_ids
        trajectories.append(scope.trajectory)
    await first_step(policy, trajectories, "streaming (OpenAI client, stream=True)")


class Mood(BaseModel):
    mood: Literal["happy", "unhappy", "unsure"]
    reason: str


async def test_json_schema_output_records_the_models_own_logprobs(policy):
    """The engine reports a constrained token's log-prob renormalised over what the schema
    allowed (0.0 where it allowed one token); the trainer sees the model's own. The
    recorded log-probs must be the model's own, and forced tokens must be marked."""
    client = policy.openai_client()
    schema = {
        "type": "json_schema",
        "json_schema": {"name": "mood", "schema": Mood.model_json_schema()},
    }
    trajectories, own_logprobs = [], []
    for review in ("I love this kettle!", "The lamp broke.", "The toaster is fine, I guess."):
        async with policy.rollout() as scope:
            reply = await client.chat.completions.create(
                model=policy.name,
                messages=[{"role": "user", "content": f"Classify: {review}"}],
                max_tokens=48,
                response_format=schema,
                logprobs=True,
            )
        [choice] = scope.trajectory.choices
        engine_said = [e.logprob for e in reply.choices[0].logprobs.content]
        # Forced where the schema allowed one token only (none when the model spaced
        # every piece: whitespace is free); the values are always the policy's.
        assert choice.constraint == "json_schema"
        assert len(choice.forced) < len(choice.token_ids)
        for position in choice.forced:  # the client saw the grammar's certainty ...
            assert engine_said[position] == 0.0
        # ... the trainer gets the model's own probability of that token
        own_logprobs += [choice.logprobs[p] for p in choice.forced]
        assert reply.choices[0].logprobs.content[0].top_logprobs == []  # as the client asked
        trajectories.append(scope.trajectory)
    assert own_logprobs and any(value < -1e-3 for value in own_logprobs)
    await first_step(policy, trajectories, "structured output (JSON schema)")


async def test_a_forced_tool_call_trains_only_the_free_tokens_in_one_sequence(
    policy, model_path, tokenizer
):
    client = policy.openai_client()
    trajectories = []
    for _ in range(2):
        async with policy.rollout() as scope:
            first = await client.chat.completions.create(
                model=policy.name,
                messages=QUESTION,
                tools=[ADD],
                tool_choice="required",
                max_tokens=96,  # room for the call at its longest (call_budget.py)
            )
            assert first.choices[0].message.tool_calls, first.choices[0]
            call = first.choices[0].message.tool_calls[0]
            follow = [
                *QUESTION,
                {"role": "assistant", "content": "", "tool_calls": [call.model_dump()]},
                {"role": "tool", "tool_call_id": call.id, "content": "5"},
            ]
            await client.chat.completions.create(
                model=policy.name, messages=follow, tools=[ADD], max_tokens=16
            )
        trajectory = scope.trajectory
        # the answer is sampled with the strict tool still offered: vLLM may constrain a
        # call there, so it is recorded as constrained (it forced nothing in a free reply)
        assert [c.constraint for c in trajectory.choices] == [
            "tool_choice=required",
            "strict_tools",
        ]
        # The engine got the call as sampled, not as the parser re-serialised it: the next
        # prompt holds its text verbatim, and its tokens wherever the text re-tokenizes to
        # them (a grammar can make the sampler spell a text in uncommon tokens; such a
        # turn is trained as a sequence of its own, each sampled token once).
        sampled, second = trajectory.choices
        text = tokenizer.decode(sampled.token_ids)
        assert text in tokenizer.decode(second.prompt_token_ids)
        canonical = tokenizer.encode(text, add_special_tokens=False) == sampled.token_ids
        sequences = build_sequences(trajectory, 1.0)
        assert len(sequences) == (1 if canonical else 2)
        sequence = sequences[0]
        trajectories.append(trajectory)

    # Which tokens get gradient: d loss / d log-prob is 0 on context and forced tokens.
    from transformers import AutoModelForCausalLM

    [row] = pack_sequences([sequence], max_tokens=len(sequence.token_ids))
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    logits = model(row.input_ids_T[None]).logits[0, :-1].float()
    new_T = torch.log_softmax(logits, -1).gather(-1, row.input_ids_T[1:, None])[:, 0]
    new_T = new_T.detach().requires_grad_(True)
    mask_T = row.sampled_mask_T[1:]
    policy_loss(
        new_T, new_T.detach(), torch.ones_like(new_T), mask_T, normalizer=1.0
    ).loss.backward()
    ids = sequence.token_ids[1:]
    forced_T = torch.tensor(sequence.forced_mask[1:], dtype=torch.bool)
    got_gradient = new_T.grad != 0
    assert not got_gradient[forced_T].any() and got_gradient[mask_T.bool()].all()
    assert torch.equal(got_gradient, mask_T.bool())
    # Forced: pieces of the call's fixed text, where the grammar allowed one token only
    # (elsewhere it allows other spellings of the same text, and the spelling is the
    # policy's). Free and trained: the argument values.
    pieces = [tokenizer.decode([t]) for t in ids]
    # (and the end of turn: one call only is asked for, so after it nothing else)
    skeleton = '<tool_call>\n{"name": "add", "arguments": {"a": , "b": }}\n</tool_call><|im_end|>'
    forced_pieces = [p for p, f in zip(pieces, forced_T, strict=True) if f]
    assert forced_pieces and all(p in skeleton for p in forced_pieces), forced_pieces
    digits = [i for i, p in enumerate(pieces) if p.strip().isdigit() and (mask_T[i] or forced_T[i])]
    assert digits and all(got_gradient[i] and not forced_T[i] for i in digits)
    print(f"\nforced {len(forced_pieces)}: {forced_pieces}; trained {int(mask_T.sum())}")
    await first_step(policy, trajectories, 'tools, tool_choice="required", two turns')


async def test_a_named_tool_call_under_the_endpoints_grammar(policy):
    """A named tool choice over a tool that is not `strict`, with an enum, optional fields,
    a nested object and a free-text string: the endpoint's envelope grammar
    (call_grammar.py) holds the arguments to the schema, bounded so the call closes
    within `max_tokens` (call_budget.py); the step trains the free tokens at ratio 1."""
    alarm = tool("set_alarm")
    client = policy.openai_client()
    trajectories = []
    asks = ("Wake me at 6:30.", "An alarm at 7 every day.", "Alarm at noon.", "Snooze 5 min.")
    for ask in asks * 2:  # about a hundred trained tokens in all (see the module docstring)
        async with policy.rollout() as scope:
            reply = await client.chat.completions.create(
                model=policy.name,
                messages=[{"role": "user", "content": ask}],
                tools=[ADD, alarm],
                tool_choice={"type": "function", "function": {"name": "set_alarm"}},
                max_tokens=256,  # room for the call at its longest (call_budget.py)
            )
        [call] = reply.choices[0].message.tool_calls
        assert call.function.name == "set_alarm"
        arguments = json.loads(call.function.arguments)
        assert isinstance(arguments["hour"], int)
        assert set(arguments) <= {"hour", "minute", "repeat", "snooze", "label"}
        [choice] = scope.trajectory.choices
        assert choice.constraint == "tool_choice=set_alarm"
        assert choice.forced and len(choice.forced) < len(choice.token_ids)
        trajectories.append(scope.trajectory)
    await first_step(policy, trajectories, "named tool choice (endpoint grammar)")


# -- a LangGraph app as users write it: router, ReAct sub-graph, summariser --------------

# The app, its tools and its shop: bench/shop_app.py (shared with bench/capture_ratio.py).


async def test_a_langgraph_app_with_a_router_a_react_agent_and_a_summariser(policy, tmp_path):
    # The router gets room: a schema allows any whitespace, which the 135M model can spend.
    llm, router_llm = chat_model(policy, max_tokens=40), chat_model(policy, max_tokens=160)
    app = build_app(llm, shop_tools(tmp_path / "shop.db"), router_llm=router_llm)

    @rollout_fn(policy)
    async def attempt(scope, question: str):
        state = await app.ainvoke({"messages": [("user", question)]}, {"recursion_limit": 8})
        scope.record_state(state)
        scope.metrics["final_messages"] = len(state["messages"])

    trajectories = [await attempt("How much is the kettle?") for _ in range(2)]
    for trajectory in trajectories:
        # The main history is the ReAct conversation the final state continues, with the
        # graph's tail appended; the router's JSON and the summary are the other two.
        assert trajectory.messages[0]["content"] == "You are the shop assistant."
        assert [c.constraint for c in trajectory.choices] == ["tool_choice=required", None]
        assert trajectory.messages[-1]["role"] == "assistant"
        assert len(trajectory.messages) == 1 + trajectory.metrics["final_messages"]
        assert not trajectory.logs, trajectory.logs
        router, summary = trajectory.additional_histories
        assert router.choices[0].constraint == "json_schema"
        route = json.loads(router.choices[0].message["content"])  # schema-valid JSON
        assert route["destination"] in ("shop", "chat")  # the graph goes to the shop anyway
        assert summary.messages[0]["content"].startswith("Summarise")
        assert summary.choices[0].constraint is None
    await first_step(policy, trajectories, "LangGraph: router, ReAct (2 SQLite tools), summariser")


async def test_the_mcp_agent(policy):
    import sys
    from pathlib import Path

    from rlcoach.integrations.mcp import ServerSpec, connect, convert_tools
    from rlcoach.integrations.mcp.agent import run_agent

    server = ServerSpec(command=[str(Path(sys.executable).with_name("mcp-server-time"))])
    async with connect(server) as connection:
        tools = convert_tools(await connection.list_tools())
    client = policy.openai_client()
    config = {"max_turns": 2, "max_tokens": 48}
    trajectories = [
        await run_agent(policy, client, server, "What time is it in Tokyo?", tools, config=config)
        for _ in range(2)
    ]
    assert all(t.choices for t in trajectories)
    await first_step(policy, trajectories, "MCP agent (mcp-server-time)")


async def test_a_forced_call_left_to_the_trainer_is_scored_as_the_engine_would(
    policy, vllm_backend
):
    """On a CPU the endpoint records a constrained reply without log-probs and the
    trainer's own at the sampling weights stand in (endpoint/rescore.py): no prompt pass
    on the engine. That is exact: the engine's own log-probs of the same tokens (asked
    afterwards through the endpoint's /v1/completions, as a teacher asks) agree with the
    trainer's within the ratio check every path passes, and the same tokens are trained.
    A step later the same replies are another version's samples and train nothing."""
    from rlcoach import Teacher

    gateway = vllm_backend.gateway
    client = policy.openai_client()
    left = []
    gateway.constrained_logprobs = "trainer"
    try:
        for ask in ("Wake me at 6:30.", "An alarm at 7 every day.", "Alarm at noon.") * 2:
            async with policy.rollout() as scope:
                await client.chat.completions.create(
                    model=policy.name,
                    messages=[{"role": "user", "content": ask}],
                    tools=[tool("set_alarm")],
                    tool_choice="required",
                    max_tokens=256,
                )
            left.append(scope.trajectory)
    finally:
        gateway.constrained_logprobs = "engine"
    for trajectory in left:
        [choice] = trajectory.choices
        assert all(x != x for x in choice.logprobs) and choice.constraint
        assert choice.forced and len(choice.forced) < len(choice.token_ids)

    scored = [t.model_copy(deep=True) for t in left]
    await Teacher(policy.served_name).score(policy, [TrajectoryGroup(scored)])
    for trajectory in scored:
        [choice] = trajectory.choices
        trajectory.choices = [
            choice.model_copy(
                update={"logprobs": choice.teacher_logprobs, "teacher_logprobs": None}
            )
        ]
    for a, b in zip(left, scored, strict=True):
        masks = [[s.sampled_mask for s in build_sequences(t, 1.0)] for t in (a, b)]
        assert masks[0] == masks[1]
    await first_step(policy, scored, "forced call, log-probs left to the trainer")

    for index, trajectory in enumerate(left):
        trajectory.reward = float(index % 2)
    result = await policy.train([TrajectoryGroup(left)])
    assert not result.stats.trained
    assert result.staleness is not None and result.staleness.unscored_untrained == len(left)
