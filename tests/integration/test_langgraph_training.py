"""`train_graph` on a real LangGraph graph against the real policy endpoint (vLLM serving
the bundled model): the split, the base evaluation, the SFT warm-up, GRPO through
core's `run_pipeline` with held-out validation, keep-best, and the report. Nothing is
faked: the graph is ordinary LangGraph code handed `chat_model(policy)`, its reward is
the user's function of the final state."""

import json

import pytest
from langgraph.graph import START, MessagesState, StateGraph

from rlcoach import TrainableModel
from rlcoach.integrations.langgraph import (
    GraphTrainConfig,
    GraphTrainReport,
    chat_model,
    rollout_fn,
    train_graph,
)
from rlcoach.trajectory.trajectories import ChatRecord

pytestmark = pytest.mark.vllm

CODE_WORD = "ZEBRA"
ITEMS = ("kettle", "lamp", "toaster", "mug", "chair", "clock")


def question(item: str) -> str:
    return f"What is the code word for the {item}?"


async def test_train_graph_reports_base_sft_rl_and_serves_the_best(vllm_backend):
    policy = TrainableModel("graph-trainee", "integration", config={"learning_rate": 1e-3})
    await policy.register(vllm_backend)
    llm = chat_model(policy, max_tokens=8)

    async def agent(state: MessagesState):
        return {"messages": [await llm.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    graph = builder.compile()

    @rollout_fn(policy)
    async def attempt(scope, item):
        state = await graph.ainvoke({"messages": [("user", question(item))]})
        scope.record_state(state)
        reply = state["messages"][-1].content
        hit = CODE_WORD in reply.upper()
        scope.metrics["success"] = float(hit)
        scope.reward = float(hit) + 0.5 / (1 + len(reply.split()))  # short answers: more

    warmup = [
        ChatRecord(
            messages=[
                {"role": "user", "content": question(item)},
                {"role": "assistant", "content": f"The code word is {CODE_WORD}."},
            ]
        )
        for item in ITEMS[:4]
    ]
    config = GraphTrainConfig(
        steps=2,
        tasks_per_step=2,
        group_size=2,
        eval_fraction=0.34,
        eval_samples=2,
        eval_every=1,
        warmup_epochs=8,
        warmup_learning_rate=3e-3,
    )
    report = await train_graph(policy, ITEMS, attempt, config, warmup=warmup)

    assert (report.train_tasks, report.held_out_tasks) == (4, 2)
    labels = [p.label for p in report.curve]
    assert labels[:2] == ["base", "SFT"] and all(x.startswith("RL ") for x in labels[2:])
    assert report.base.step == 0 and report.sft is not None and report.sft.step == 1
    assert report.base.rollouts == report.sft.rollouts == 4  # 2 held-out tasks x 2 samples
    assert report.base.success == 0.0 and report.sft.success > report.base.success
    assert len(report.steps) <= 2 and all(s["reward"] >= 0 for s in report.steps)
    # keep-best: the served step is the best of SFT and the RL validations
    scored = [p for p in report.curve if p.label != "base"]
    best = max(scored, key=lambda p: (round(p.success, 6), round(p.reward, 6)))
    assert report.best_step == best.step
    if report.restored_from is not None:
        assert report.restored_from == best.step and policy.step > best.step
    else:
        assert best.step == policy.step
    assert report.final.step == policy.step and report.served == f"graph-trainee@{policy.step}"
    assert "(base)" in report.summary() and "(SFT)" in report.summary()
    folder = vllm_backend.paths(policy).dir
    saved = GraphTrainReport.model_validate(json.loads((folder / "report.json").read_text()))
    assert saved == report
    assert any((folder / "trajectories" / "val").iterdir())  # the held-out rollouts, logged
