"""Real LangGraph graphs against the real policy endpoint (vLLM serving the bundled model).

Each graph is ordinary LangGraph code handed `chat_model(policy)`; nothing in it knows
about rlcoach. The 135M model rarely calls a tool on its own, so where a test needs a
particular tool call the graph constrains the real engine's sampling to it with vLLM
structured outputs (`extra_body`, through LangGraph's own dynamic-model hook). The
engine still samples the call's tokens, its tool parser reads them, LangGraph runs the
tool, and the gateway records every call. Each test checks the exact number of calls
the graph made (counted independently by a LangChain callback), that every sampled turn
carries token ids and logprobs, and that the trajectories train: one optimizer step
changes the LoRA.
"""

import json
import warnings
from typing import Literal

import pytest
import torch
from langchain_core.callbacks import AsyncCallbackHandler
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from pydantic import BaseModel
from safetensors.torch import load_file

from rlcoach import BUNDLED_MODEL, Model, TrainableModel, TrajectoryGroup
from rlcoach.integrations.langgraph import chat_model, rollout, rollout_fn

pytestmark = pytest.mark.vllm

PRICES = {"kettle": 24.5, "lamp": 12.0}
STOCK = {"kettle": 3, "lamp": 0}


@tool
def lookup_price(item: str) -> str:
    """The price of an item in euros."""
    return f"{PRICES[item]:.2f} EUR"


@tool
def count_stock(item: str) -> int:
    """How many of an item are in stock."""
    return STOCK[item]


class CallCounter(AsyncCallbackHandler):
    """Counts chat-model calls as LangChain sees them: the independent tally."""

    def __init__(self) -> None:
        self.calls = 0

    async def on_chat_model_start(self, serialized, messages, **kwargs) -> None:
        self.calls += 1


def forced_call(name: str, arguments: dict) -> dict:
    call = f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"
    return {"structured_outputs": {"choice": [call]}}


@pytest.fixture(scope="module")
async def policy(vllm_backend):
    model = TrainableModel("graph-agent", "integration", config={"learning_rate": 2e-3})
    await model.register(vllm_backend)
    return model


def adapter(backend, model) -> dict[str, torch.Tensor]:
    if model.step == 0:
        return {}
    return load_file(backend.paths(model).checkpoint(model.step) / "adapter_model.safetensors")


async def assert_trains(backend, model, trajectories) -> None:
    """One optimizer step on these trajectories (rewards made to differ) moves the LoRA."""
    for index, trajectory in enumerate(trajectories):
        trajectory.reward = float(index)
    before = adapter(backend, model)
    result = await model.train([TrajectoryGroup(trajectories)])
    assert result.stats.trained and result.stats.sampled_tokens > 0
    after = adapter(backend, model)
    changed = [
        name
        for name, value in after.items()
        if name not in before or not torch.equal(before[name], value)
    ]
    assert changed, "the optimizer step left every LoRA tensor as it was"


def assert_exact_tokens(trajectory) -> None:
    for history in trajectory.histories():
        for choice in history.choices:
            assert choice.token_ids and len(choice.logprobs) == len(choice.token_ids)
            assert choice.prompt_token_ids and choice.policy.startswith("graph-agent@")


async def test_prebuilt_react_agent_with_two_tools_async_and_synchronous(policy, vllm_backend):
    with warnings.catch_warnings():  # deprecated for langchain.agents, still widely used
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent
    llm = chat_model(policy, max_tokens=48)  # room for the longest forced call
    tools = [lookup_price, count_stock]

    def pick_model(state, runtime):  # LangGraph's dynamic-model hook
        item = "lamp" if "lamp" in state["messages"][0].content else "kettle"
        plan = [
            forced_call("lookup_price", {"item": item}),
            forced_call("count_stock", {"name": item}),
        ]  # a bad argument: a tool error
        done = sum(m.type == "tool" for m in state["messages"])
        if done < len(plan):
            return llm.bind_tools(tools, extra_body=plan[done])
        return llm.bind_tools(tools, tool_choice="none")

    graph = create_react_agent(pick_model, tools)

    @rollout_fn(policy, task="lamp")
    def synchronous_app(scope, question, counter):  # graph.invoke, in a worker thread
        scope.record_state(graph.invoke(question, config={"callbacks": [counter]}))

    trajectories = []
    for item in ("kettle", "lamp"):  # the first run async, the second synchronous
        counter = CallCounter()
        question = {"messages": [("user", f"How much is a {item}, and is it in stock?")]}
        if item == "kettle":
            async with rollout(policy, task=item) as scope:
                state = await graph.ainvoke(question, config={"callbacks": [counter]})
                scope.record_state(state)
            trajectory = scope.trajectory
        else:
            trajectory = await synchronous_app(question, counter)
        assert counter.calls == 3
        assert len(trajectory.choices) == 3 and not trajectory.additional_histories
        roles = [m["role"] for m in trajectory.messages]
        assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
        price_call = trajectory.messages[1]["tool_calls"][0]["function"]
        assert price_call["name"] == "lookup_price"
        assert json.loads(price_call["arguments"]) == {"item": item}
        assert trajectory.messages[2]["content"] == lookup_price.invoke(item)  # real answer
        assert "item" in trajectory.messages[4]["content"]  # the validation error it sent back
        assert trajectory.messages[4]["is_error"] is True  # from LangChain's status="error"
        assert "is_error" not in trajectory.messages[2]
        assert trajectory.metrics == {"tool_calls": 2.0, "tool_errors": 1.0}
        assert trajectory.tools and {t["function"]["name"] for t in trajectory.tools} == {
            "lookup_price",
            "count_stock",
        }
        assert_exact_tokens(trajectory)
        trajectories.append(trajectory)
    await assert_trains(vllm_backend, policy, trajectories)


async def test_a_sub_agent_lands_in_an_extra_history_and_a_fixed_model_is_not_trained(
    policy, vllm_backend
):
    llm = chat_model(policy, max_tokens=16)
    # A supervisor kept on a fixed model: the base weights, behind the same endpoint.
    supervisor = chat_model(Model(BUNDLED_MODEL, base_url=policy.api_base), max_tokens=8)

    async def researcher(state: MessagesState):  # a nested sub-graph, its own conversation
        async def summarise(inner: MessagesState):
            return {"messages": [await llm.ainvoke(inner["messages"])]}

        sub = StateGraph(MessagesState)
        sub.add_node("summarise", summarise)
        sub.add_edge(START, "summarise")
        notes = await sub.compile().ainvoke(
            {"messages": [("user", "Summarise in five words: kettles boil water.")]}
        )
        return {"messages": [HumanMessage(f"Research notes: {notes['messages'][-1].content}")]}

    async def agent(state: MessagesState):
        return {"messages": [await llm.ainvoke(state["messages"])]}

    async def review(state: MessagesState):
        return {"messages": [await supervisor.ainvoke(state["messages"])]}

    def route(state: MessagesState):
        return "researcher" if len(state["messages"]) < 3 else "review"

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("researcher", researcher)
    builder.add_node("review", review)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["researcher", "review"])
    builder.add_edge("researcher", "agent")
    builder.add_edge("review", END)
    graph = builder.compile()

    @rollout_fn(policy, task="appliance-notes")
    async def attempt(scope, question):
        counter = CallCounter()
        state = await graph.ainvoke(
            {"messages": [("user", question)]}, config={"callbacks": [counter]}
        )
        scope.record_state(state)
        scope.metrics["graph_calls"] = counter.calls

    trajectories = [await attempt("What does a kettle do?"), await attempt("What is a lamp?")]
    for trajectory in trajectories:
        # agent, researcher's summariser, agent again, supervisor: 4 calls, 3 recorded.
        assert trajectory.metrics["graph_calls"] == 4
        assert len(trajectory.choices) == 2 and len(trajectory.additional_histories) == 1
        [notes] = trajectory.additional_histories
        assert len(notes.choices) == 1 and "Summarise" in notes.messages[0]["content"]
        assert trajectory.messages[2]["content"].startswith("Research notes: ")
        assert trajectory.messages[-1]["role"] == "assistant"  # the supervisor's review,
        assert len(trajectory.messages) == 5  # kept for the judge but never trained on
        assert trajectory.policy_versions == [policy.served_name]
        assert_exact_tokens(trajectory)
    await assert_trains(vllm_backend, policy, trajectories)


class Verdict(BaseModel):
    """Whether the user is happy."""

    mood: Literal["happy", "unhappy"]


async def test_a_node_with_structured_output(policy, vllm_backend):
    judge_mood = chat_model(policy, max_tokens=64).with_structured_output(Verdict)

    async def classify(state: MessagesState):
        verdict = await judge_mood.ainvoke(state["messages"])
        return {"messages": [AIMessage(verdict.mood)]}

    builder = StateGraph(MessagesState)
    builder.add_node("classify", classify)
    builder.add_edge(START, "classify")
    graph = builder.compile()
    trajectories = []
    for review in ("I love this kettle!", "This lamp broke on day one."):
        async with rollout(policy) as scope:
            state = await graph.ainvoke({"messages": [("user", review)]})
        assert state["messages"][-1].content in ("happy", "unhappy")
        trajectory = scope.trajectory
        [choice] = trajectory.choices  # one call, not lost to the structured-output parser
        assert json.loads(choice.message["content"])["mood"] in ("happy", "unhappy")
        assert_exact_tokens(trajectory)
        trajectories.append(trajectory)
    await assert_trains(vllm_backend, policy, trajectories)


async def test_a_streamed_run(policy, vllm_backend):
    llm = chat_model(policy, max_tokens=16, streaming=True)

    async def agent(state: MessagesState):
        return {"messages": [await llm.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    graph = builder.compile()
    trajectories = []
    for room in ("kitchen", "bathroom"):
        async with rollout(policy) as scope:
            streamed = ""
            async for chunk, _meta in graph.astream(
                {"messages": [("user", f"Name a {room} appliance.")]}, stream_mode="messages"
            ):
                streamed += chunk.content
            events = [
                e["event"]
                async for e in graph.astream_events(
                    {"messages": [("user", "Name a colour.")]}, version="v2"
                )
            ]
        trajectory = scope.trajectory
        assert "on_chat_model_stream" in events
        # two runs, two calls: the one that streamed tokens extends nothing the other saw
        assert len(trajectory.histories()) == 2
        texts = {h.choices[0].message.get("content", "") for h in trajectory.histories()}
        assert streamed in texts
        assert_exact_tokens(trajectory)
        trajectories.append(trajectory)
    await assert_trains(vllm_backend, policy, trajectories)


async def test_retries_and_fallbacks_are_captured(policy, vllm_backend):
    """A fallback from a model the endpoint does not serve, and a retry after a parser
    rejects the first answer: both policy calls land in the trajectory, the failed ones
    (404s) do not."""
    missing = chat_model(Model("not-served-here", base_url=policy.api_base), max_retries=0)
    llm = chat_model(policy, max_tokens=8)
    seen = []

    def picky(message: AIMessage) -> AIMessage:
        seen.append(message.content)
        if len(seen) % 2:
            raise ValueError("the first answer is always rejected")
        return message

    chain = (missing.with_fallbacks([llm]) | picky).with_retry(stop_after_attempt=2)

    async def agent(state: MessagesState):
        return {"messages": [await chain.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    graph = builder.compile()
    trajectories = []
    for thing in ("kettle", "lamp"):
        counter = CallCounter()
        async with rollout(policy) as scope:
            await graph.ainvoke(
                {"messages": [("user", f"Describe a {thing}.")]}, config={"callbacks": [counter]}
            )
        trajectory = scope.trajectory
        assert counter.calls == 4  # missing, policy, missing again, policy again
        # the retry asks the same question again: a second history, not a continuation
        histories = trajectory.histories()
        assert len(histories) == 2 and all(len(h.choices) == 1 for h in histories)
        # the main history is the answer the graph kept (the retry's), the rejected one next
        assert [h.choices[0].message.get("content") or "" for h in histories] == [
            seen[-1],
            seen[-2],
        ]
        assert_exact_tokens(trajectory)
        trajectories.append(trajectory)
    await assert_trains(vllm_backend, policy, trajectories)
