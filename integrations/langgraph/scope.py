"""The rollout scope for a LangGraph run, and what the graph's final state adds to it.

    async with rollout(policy, question_id=7) as scope:
        state = await graph.ainvoke({"messages": [("user", question)]})
        scope.record_state(state)
        scope.reward = judge(state)

The calls are captured by the gateway (see `chat.py`); on exit the recorded exchanges
become the trajectory. The main history is the conversation the graph's final state
continues — the one the user sees — so `record_state` decides it: the history sharing
the most messages with the final state, never a router's structured-output exchange
over a free conversation (rlcoach.trajectory.histories states the rule; without `record_state`,
the history of the last call). Calls that do not extend it (sub-agents, summarisers,
routers) are additional histories. What the gateway cannot see is what happened after
the last policy call (tool results of a run cut off by `recursion_limit`, a final
node's output), so `record_state` also appends the graph's messages after the main
history's last reply, as the graph produced them (tool errors included), and counts tool
calls and tool errors. A tool message LangGraph marked as failed (`ToolMessage.status ==
"error"`, which the OpenAI request format drops) gets `"is_error": true` wherever the
trajectory holds it, so the timeline, the sinks and the report count it. The trainer
ignores those messages (it trains sampled tokens only); a RULER judge reads them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec

from rlcoach import Rollout, Trajectory
from rlcoach.errors import ConfigError
from rlcoach.trajectory.histories import message_key
from rlcoach.trajectory.trajectories import TOOL_ERROR_KEY

if TYPE_CHECKING:
    from rlcoach import TrainableModel
    from rlcoach.trajectory.trajectories import Message, Scalar

__all__ = ["GraphRollout", "rollout", "rollout_fn", "to_openai_messages"]

P = ParamSpec("P")

SYNC_ROLLOUT_THREADS = 256
"""Threads for synchronous rollouts (`rollout_fn` on a plain `def`): a rollout mostly waits
for the policy, so as many as a step's rollouts, not asyncio's CPU-sized default pool."""


@functools.cache
def _threads() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(
        SYNC_ROLLOUT_THREADS, thread_name_prefix="rlcoach-rollout"
    )


def to_openai_messages(messages: Sequence[Any]) -> list[Message]:
    """LangChain messages (or OpenAI dicts, or `(role, text)` pairs) as OpenAI dicts."""
    from langchain_core.messages import convert_to_openai_messages

    return list(convert_to_openai_messages(list(messages)))


def _state_messages(state: Mapping[str, Any] | Sequence[Any]) -> Sequence[Any]:
    if isinstance(state, Mapping):
        if "messages" not in state:
            raise ConfigError(
                f"record_state() got a state with keys {sorted(state)} and no 'messages'; "
                "fix: pass the list of messages itself, e.g. "
                "record_state(state['my_messages'])"
            )
        return state["messages"]
    return state


class GraphRollout(Rollout):
    """A `Rollout` that also takes the graph's final messages (see the module docstring)."""

    def __init__(self, source: Any, **metadata: Scalar) -> None:
        super().__init__(source, **metadata)
        self._final: list[Message] = []
        self._failed_calls: set[str] = set()

    def record_state(self, state: Mapping[str, Any] | Sequence[Any]) -> None:
        """Keep the graph's final messages; counts `tool_calls` and `tool_errors` metrics."""
        messages = list(_state_messages(state))
        self._final = to_openai_messages(messages)
        calls = sum(len(getattr(m, "tool_calls", None) or []) for m in messages)
        failed = [m for m in messages if getattr(m, "status", None) == "error"]
        self._failed_calls = {m.tool_call_id for m in failed if getattr(m, "tool_call_id", None)}
        self.metrics["tool_calls"] = float(calls)
        self.metrics["tool_errors"] = float(len(failed))

    def final_messages(self) -> list[Message] | None:
        return self._final or None

    async def collect(self) -> Trajectory:
        trajectory = await super().collect()
        self._flag_failed_calls(trajectory)
        if not self._final or not trajectory.choices:
            return trajectory
        # The graph's state may lack what a node prepends (a system prompt, examples) or
        # trims, so align on the policy's last reply, not on the start of the history.
        last = message_key(trajectory.messages[-1])
        keys = [message_key(m) for m in self._final]
        if last in keys:
            after = len(keys) - keys[::-1].index(last)
            trajectory.messages = [*trajectory.messages, *self._final[after:]]
        else:
            self.log(
                "record_state: the policy's last reply is not among the graph's final "
                "messages; nothing was appended to the main conversation"
            )
        return trajectory

    def _flag_failed_calls(self, trajectory: Trajectory) -> None:
        """Mark the answers to the calls LangGraph saw fail, in every history and in the
        graph's final messages (the gateway recorded them without LangChain's status)."""
        if not self._failed_calls:
            return
        histories = [trajectory.messages, self._final]
        histories += [h.messages for h in trajectory.additional_histories]
        for messages in histories:
            for message in messages:
                if message.get("role") == "tool" and message.get("tool_call_id") in (
                    self._failed_calls
                ):
                    message[TOOL_ERROR_KEY] = True


def rollout(model: TrainableModel, **metadata: Scalar) -> GraphRollout:
    """A scope whose policy calls (from any `chat_model(model)` inside it) become one trajectory."""
    return GraphRollout(model.backend, **metadata)


def rollout_fn(
    model: TrainableModel, **metadata: Scalar
) -> Callable[[Callable[Concatenate[GraphRollout, P], Any]], Callable[P, Awaitable[Trajectory]]]:
    """Make `attempt(scope, *args)` a rollout per call that returns its Trajectory.

    @rollout_fn(policy)
    async def attempt(scope, question):
        state = await graph.ainvoke({"messages": [("user", question)]})
        scope.record_state(state)
        scope.reward = score(question, state)

    groups = await gather_trajectory_groups([attempt(q) for _ in range(8)] for q in qs)

    A plain `def attempt(scope, question)` (a graph run with `graph.invoke`) runs in a
    worker thread, inside the same scope: the thread inherits the rollout id, and
    `chat_model(policy)`'s synchronous client stamps its calls with it, so a synchronous
    app is trained as it is. Up to `SYNC_ROLLOUT_THREADS` run at once.
    """

    def wrap(
        function: Callable[Concatenate[GraphRollout, P], Any],
    ) -> Callable[P, Awaitable[Trajectory]]:
        synchronous = not inspect.iscoroutinefunction(function)

        @functools.wraps(function)
        async def run(*args: P.args, **kwargs: P.kwargs) -> Trajectory:
            async with rollout(model, **metadata) as scope:
                if synchronous:  # the thread runs in a copy of this context: the rollout id
                    call = functools.partial(function, scope, *args, **kwargs)
                    context = contextvars.copy_context()
                    loop = asyncio.get_running_loop()
                    await loop.run_in_executor(_threads(), context.run, call)
                else:
                    await function(scope, *args, **kwargs)
            return scope.trajectory

        return run

    return wrap
