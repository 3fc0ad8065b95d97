"""LangGraph apps (`rlcoach.integrations.langgraph`, extra `[langgraph]`): train a graph as it is.

    from rlcoach.integrations.langgraph import chat_model, rollout

    llm = chat_model(policy)                       # a ChatOpenAI on the policy endpoint
    graph = build_my_graph(llm)                     # the user's own, unmodified code
    async with rollout(policy, task=task_id) as scope:
        state = await graph.ainvoke({"messages": [("user", question)]})
        scope.record_state(state)                   # what followed the last call
        scope.reward = my_reward(state)
    trajectory = scope.trajectory                   # every policy call, exact tokens

`train_graph(policy, tasks, attempt)` runs the whole loop on such an `attempt`: train
and held-out splits, an optional SFT warm-up, GRPO with held-out validation (keep-best,
early stop) and a base -> SFT -> RL report (`training.py`).

Nodes that should stay on a fixed model get `chat_model(Model(...))`: those calls are
not recorded, so only the policy's calls are trained.
"""

from rlcoach.integrations.langgraph.chat import chat_model
from rlcoach.integrations.langgraph.scope import (
    GraphRollout,
    rollout,
    rollout_fn,
    to_openai_messages,
)
from rlcoach.integrations.langgraph.training import (
    GraphTrainConfig,
    GraphTrainReport,
    HeldOutPoint,
    train_graph,
)

__all__ = [
    "GraphRollout",
    "GraphTrainConfig",
    "GraphTrainReport",
    "HeldOutPoint",
    "chat_model",
    "rollout",
    "rollout_fn",
    "to_openai_messages",
    "train_graph",
]
