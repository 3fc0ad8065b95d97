"""The MCP agent loop: the policy calls a server's tools until it gives a final answer.

    tools = convert_tools(await server.list_tools())
    trajectory = await run_agent(model, client, spec, "Is the red widget in stock?", tools)

One rollout opens one session with the server (for stdio, one server process, so every
rollout starts from the server's initial state) and closes it on every exit path. Each
turn the policy sees the conversation and the tools; its first reply is one tool call
(`first_tool_choice="required"`, held to the tool's schema by the endpoint's grammar),
later ones may call tools or answer. Every tool call it makes is checked
against the tool's schema first (a bad call is answered with the problem and never
reaches the server), then run with `call_timeout_s`; the result (text, structured
content as JSON, errors, notes for images) goes back as a tool message cut to
`result_chars` with a marker. A reply without tool calls is the final answer (with
`finish_tool`, calling `final_answer` also ends it). `max_turns` bounds the policy's
replies and `rollout_timeout_s` the whole rollout.

A call that outlives `call_timeout_s`, the rollout timeout and a server that dies raise:
`gather_trajectory_groups` records the rollout as failed and training goes on. Tool
errors and rejected calls are not failures: the policy sees them, and they are counted.

The reward is the `check`'s score in [0, 1] of what happened (`AgentRun`); the default,
`tool_use_check`, needs no knowledge of the server: a successful tool call, then a
final answer, with no rejected or failed calls along the way. Success means score 1.
RULER can replace or blend with it (`rlcoach.integrations.mcp.reward`).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ConfigDict, Field

from rlcoach.autorl.grounded import cut_result
from rlcoach.config import parse_config
from rlcoach.errors import ConfigError, RLCoachError
from rlcoach.integrations.mcp.connection import Connection, ServerSpec, connect
from rlcoach.integrations.mcp.tools import ToolSet
from rlcoach.trajectory.trajectories import Message, Tool, Trajectory, tool_message
from rlcoach.validation import Config

if TYPE_CHECKING:
    from openai import AsyncOpenAI

    from rlcoach.model import TrainableModel

__all__ = [
    "AgentConfig",
    "AgentRun",
    "CallRecord",
    "Check",
    "Example",
    "RolloutTimeoutError",
    "ToolTimeoutError",
    "build_demonstration",
    "example_arguments",
    "offered_tools",
    "run_agent",
    "tool_use_check",
]

FINISH_TOOL = "final_answer"
DEFAULT_SYSTEM = (
    "You are an assistant with tools. Use the tools to find out or do what the "
    "user asks, then answer the user briefly."
)


class ToolTimeoutError(RLCoachError, TimeoutError):
    """A tool call outlived `call_timeout_s` (the rollout is recorded as failed)."""


class RolloutTimeoutError(RLCoachError, TimeoutError):
    """A rollout outlived `rollout_timeout_s` (it is recorded as failed)."""


class AgentConfig(Config):
    """How one rollout runs."""

    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(4, ge=1, le=100)
    """Policy replies per rollout; the rollout ends unfinished after the last."""
    call_timeout_s: float = Field(30.0, gt=0)
    """Upper bound on one tool call; a call that exceeds it fails the rollout."""
    rollout_timeout_s: float = Field(600.0, gt=0)
    """Upper bound on the whole rollout, server start-up included."""
    result_chars: int = Field(1500, ge=40)
    """Tool results longer than this are cut, with a marker saying how much was cut."""
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    max_tokens: int = Field(192, ge=8)
    """Completion budget of each policy reply."""
    system_prompt: str = DEFAULT_SYSTEM
    finish_tool: bool = False
    """Also offer a `final_answer(answer)` tool for models that always call a tool."""
    first_tool_choice: Literal["auto", "required"] = "required"
    """`tool_choice` of the policy's first reply. `required` (every task for a tool server
    needs its tools): the first reply is one call of an offered tool with arguments that
    fit its schema, which the policy endpoint's grammar guarantees; the constrained tokens
    are sampled and trained like any others, only those the grammar left no choice in are
    kept out of the loss. `auto`: the policy may answer without a call."""
    call_max_tokens: int = Field(1024, ge=8)
    """Completion budget of a forced first reply (at least `max_tokens`). The reply ends
    where its call does, so this only bounds the call's values: the endpoint bounds each
    free value so that the call fits the budget at its longest (4 bytes a character, 1 a
    token), and at 192 tokens `mcp-server-git`'s `git_log` would get 3 characters for its
    repository path; at 1024, 70."""
    strict_tools: bool = False
    """Offer the tools as `strict` (OpenAI's `function.strict`): once the policy opens a
    call in any reply, the grammar holds it to an offered tool's name and schema, while a
    text answer stays free. Off by default: such a reply may be text, so its budget stays
    `max_tokens`, which bounds the call's values as above (3 characters for that path).

    A tool set with a schema no grammar can hold (`ToolSet.unforceable`) gets neither a
    forced first call nor strict tools: its calls are sampled freely and checked after."""
    extra_body: dict[str, Any] = Field(default_factory=dict)
    """Extra request fields for the policy's engine (vLLM: `seed`, `top_p`, ...)."""


@dataclass
class CallRecord:
    """One tool call the policy made, and what came of it."""

    name: str
    arguments: str
    """The arguments as the policy wrote them (a JSON string)."""
    outcome: str
    """`ok`, `tool_error` (the server said no) or `rejected` (failed the schema check)."""
    result: str = ""


@dataclass
class AgentRun:
    """What happened in one rollout: what a check scores."""

    scenario: str
    messages: list[Message]
    calls: list[CallRecord] = field(default_factory=list)
    final_answer: str | None = None
    turns: int = 0
    given: Any = None
    """The scenario as given: an `InputRecord`'s metadata can carry what a check needs."""

    @property
    def finished(self) -> bool:
        return self.final_answer is not None

    def count(self, outcome: str) -> int:
        return sum(call.outcome == outcome for call in self.calls)


Check = Callable[[AgentRun], float | bool | Awaitable[float | bool]]
"""Scores a rollout in [0, 1] (True/False count as 1/0); may be async."""


def tool_use_check(run: AgentRun) -> float:
    """Server-agnostic score: 0.5 for a successful call, 0.3 for then giving a final
    answer, 0.2 for making no rejected or failed calls (only when a call succeeded).

    A rollout whose calls were all rejected or failed gets 0.1: it used the tool-call
    format, which a small model's first attempts often do not, so GRPO has a gradient
    towards calling tools before any call succeeds (a strict reward on a policy that
    almost never calls starts at zero variance and cannot learn)."""
    if not run.count("ok"):
        return 0.1 if run.calls else 0.0
    clean = run.count("tool_error") + run.count("rejected") == 0
    return 0.5 + 0.3 * run.finished + 0.2 * clean


def _finish_tool() -> Tool:
    return {
        "type": "function",
        "function": {
            "name": FINISH_TOOL,
            "description": "Give the final answer to the user and stop.",
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "string"}},
                "required": ["answer"],
            },
        },
    }


def _scenario_text(scenario: Any) -> tuple[str, dict[str, Any]]:
    if isinstance(scenario, str):
        return scenario, {}
    text = getattr(scenario, "text", None)
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(
            f"scenario {scenario!r} has no text for the agent's task; fix: pass a string or "
            "an InputRecord"
        )
    return text, {
        "scenario_id": str(getattr(scenario, "id", "")),
        "difficulty": str(getattr(scenario, "difficulty", "")),
    }


async def _score(check: Check, run: AgentRun) -> float:
    value = check(run)
    if inspect.isawaitable(value):
        value = await value
    score = float(value)
    if not 0.0 <= score <= 1.0:
        raise ConfigError(
            f"the check returned {score!r}, outside [0, 1]: it becomes the reward; fix: "
            "make the check return a number from 0 to 1 (or a bool)"
        )
    return score


async def _call(
    connection: Connection, tools: ToolSet, call: Any, config: AgentConfig, run: AgentRun
) -> Message:
    """Run one tool call; the answer is a tool message, flagged as an error when it is one
    (its text also says so, for the policy to read)."""
    name, raw = call.function.name, call.function.arguments or ""
    checked = tools.check_call(name, raw)
    if checked.error is not None:
        run.calls.append(CallRecord(name, raw, "rejected", checked.error))
        return tool_message(call.id, f"error: {checked.error}", error=True)
    try:
        result = await connection.call_tool(
            checked.name, checked.arguments or {}, timeout_s=config.call_timeout_s
        )
    except TimeoutError as e:
        raise ToolTimeoutError(
            f"tool {checked.name!r} of MCP server {connection.spec.label!r} "
            f"did not answer within call_timeout_s={config.call_timeout_s}; "
            "raise call_timeout_s if the tool is just slow"
        ) from e
    text = cut_result(result.text or "(no output)", config.result_chars)
    run.calls.append(CallRecord(name, raw, "tool_error" if result.is_error else "ok", text))
    if result.is_error and not text.startswith("error"):
        text = f"error: {text}"
    return tool_message(call.id, text, error=result.is_error)


async def run_agent(
    model: TrainableModel,
    client: AsyncOpenAI,
    server: ServerSpec,
    scenario: Any,
    tools: ToolSet,
    *,
    config: AgentConfig | dict[str, Any] | None = None,
    demonstration: Sequence[Message] = (),
    check: Check = tool_use_check,
    evaluation: bool = False,
) -> Trajectory:
    """One rollout of `scenario` (a string or an `InputRecord`); see the module docstring.

    `demonstration` messages go between the system prompt and the task (a worked example
    for small models, see `build_demonstration`); they are prompt, never trained on.
    `evaluation=True`: a held-out rollout, measured and never trained on
    (`model.rollout(evaluation=True)`).
    """
    config = parse_config(AgentConfig, config)
    text, metadata = _scenario_text(scenario)
    offered = offered_tools(tools, config)
    prompt: list[Message] = [{"role": "system", "content": config.system_prompt}, *demonstration]
    run = AgentRun(text, [*prompt, {"role": "user", "content": text}], given=scenario)
    async with model.rollout(evaluation=evaluation, server=server.label, **metadata) as rollout:
        rollout.trajectory.metadata["prompt_messages"] = len(prompt)
        try:
            async with asyncio.timeout(config.rollout_timeout_s), connect(server) as connection:
                sent = await _turns(model, client, connection, tools, offered, run, config)
        except ToolTimeoutError:
            raise
        except TimeoutError as e:
            raise RolloutTimeoutError(
                f"the rollout outlived rollout_timeout_s={config.rollout_timeout_s} after "
                f"{run.turns} turns and {len(run.calls)} tool calls; raise it, or lower "
                "max_turns or max_tokens"
            ) from e
        score = await _score(check, run)
        rollout.reward = score
        rollout.metrics.update(
            {
                "success": float(score == 1.0),
                "finished": float(run.finished),
                "turns": float(run.turns),
                "tool_calls": float(len(run.calls)),
                "tool_ok": float(run.count("ok")),
                "tool_errors": float(run.count("tool_error")),
                "invalid_calls": float(run.count("rejected")),
                "check": score,
            }
        )
        for record in run.calls:
            if record.outcome != "ok":
                rollout.log(
                    f"{record.outcome} {record.name}({record.arguments}): {record.result[:300]}"
                )
    trajectory = rollout.trajectory
    # The gateway recorded up to the last reply; tool answers after it are ours to add.
    trajectory.messages = [*trajectory.messages, *run.messages[sent + 1 :]]
    return trajectory


async def _turns(
    model: TrainableModel,
    client: AsyncOpenAI,
    connection: Connection,
    tools: ToolSet,
    offered: list[Tool],
    run: AgentRun,
    config: AgentConfig,
) -> int:
    """The policy's turns; returns how many messages the last request carried."""
    messages, sent = run.messages, 0
    forced = config.first_tool_choice == "required" and _held(tools)
    while run.turns < config.max_turns and not run.finished:
        sent = len(messages)
        # The forced first reply: one call, with room for its values (call_max_tokens).
        turn: dict[str, Any] = (
            {
                "tool_choice": "required",
                "parallel_tool_calls": False,
                "max_tokens": max(config.max_tokens, config.call_max_tokens),
            }
            if forced and run.turns == 0
            else {"tool_choice": "auto", "max_tokens": config.max_tokens}
        )
        reply = await client.chat.completions.create(
            model=model.served_name,
            messages=messages,
            tools=offered,
            temperature=config.temperature,
            extra_body=config.extra_body or None,
            **turn,
        )
        run.turns += 1
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            run.final_answer = message.content or ""
            break
        for call in message.tool_calls:
            if call.function.name == FINISH_TOOL and config.finish_tool:
                run.final_answer = _finish_answer(call.function.arguments)
                messages.append(tool_message(call.id, "done"))
            else:
                messages.append(await _call(connection, tools, call, config, run))
    return sent


def _held(tools: ToolSet) -> bool:
    """Whether the endpoint's grammar can hold calls to these tools (it refuses to force
    or `strict`-check a schema it cannot enforce)."""
    return not tools.unforceable()


def offered_tools(tools: ToolSet, config: AgentConfig) -> list[Tool]:
    """The tools as the policy is offered them (rollouts and the SFT warm-up alike)."""
    offered = [*tools.tools, _finish_tool()] if config.finish_tool else list(tools.tools)
    if not (config.strict_tools and _held(tools)):
        return offered
    return [{**t, "function": {**t["function"], "strict": True}} for t in offered]


def _finish_answer(arguments: str | None) -> str:
    try:
        parsed = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return arguments or ""
    return str(parsed.get("answer", "")) if isinstance(parsed, dict) else str(parsed)


# --- a worked example from a real call, for models too small to call tools unprompted

_EXAMPLE_IN_TEXT = re.compile(
    r"""(?:e\.g\.|for example|such as|like)[,:]?\s*['"`]?"""
    r"""([^'"`\s,;)]+)""",
    re.IGNORECASE,
)


def _example_value(schema: dict[str, Any], root_name: str = "") -> Any:
    for key in ("const", "default"):
        if key in schema:
            return schema[key]
    if schema.get("examples"):
        return schema["examples"][0]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        options = [o for o in schema.get(key, []) if o.get("type") != "null"]
        if options:
            return _example_value(options[0], root_name)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "object" or "properties" in schema:
        return example_arguments(schema)
    if kind == "array":
        return [_example_value(schema.get("items", {"type": "string"}), root_name)]
    if kind in ("integer", "number"):
        value = max(schema.get("minimum", 1), 1)
        return int(value) if kind == "integer" else float(value)
    if kind == "boolean":
        return True
    found = _EXAMPLE_IN_TEXT.search(schema.get("description", ""))
    if found:
        return found.group(1).rstrip(".")
    if schema.get("format") == "email" or "email" in root_name.lower():
        return "ada@example.com"
    return root_name.replace("_", " ") or "example"


def example_arguments(schema: dict[str, Any]) -> dict[str, Any]:
    """Plausible arguments for a schema: its required fields from consts, defaults,
    examples, enums, `e.g.` values in descriptions, else type-shaped placeholders."""
    properties = schema.get("properties", {})
    # With nothing required, show one argument anyway: a call with `{}` teaches little.
    names = schema.get("required") or list(properties)[:1]
    return {name: _example_value(properties[name], name) for name in names if name in properties}


class Example(Config):
    """A worked example given by the user: a request and the call that serves it. The
    call is run against the real server; its answer goes into the demonstration."""

    model_config = ConfigDict(extra="forbid")

    request: str = Field(min_length=1)
    tool: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)
    answer: str | None = None
    """The final reply after the tool's answer (default: a summary of that answer)."""


def _worked(
    index: int,
    request: str,
    name: str,
    arguments: dict[str, Any],
    result: str,
    answer: str | None,
    result_chars: int,
) -> list[Message]:
    shown = cut_result(result, result_chars)
    call_id = f"call_example_{index}"
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }
    reply = answer or f"Here is what I found: {' '.join(shown.split())[:160]}"
    return [
        {"role": "user", "content": request},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        tool_message(call_id, shown),
        {"role": "assistant", "content": reply},
    ]


async def build_demonstration(
    connection: Connection,
    tools: ToolSet,
    examples: Sequence[Example | dict[str, Any]] = (),
    *,
    result_chars: int = 300,
    timeout_s: float = 30.0,
) -> list[Message]:
    """Worked examples from real calls: request, tool call, the server's answer, reply.

    With `examples`, one per example (a call the schema or the server refuses raises
    `ConfigError` naming it); without, one for the first tool whose `example_arguments`
    the server answers without an error (none: empty). The calls run on `connection`,
    so pick a session whose state does not matter (for stdio, a throwaway one).
    """
    messages: list[Message] = []
    for index, given in enumerate(examples):
        example = given if isinstance(given, Example) else Example.model_validate(given)
        checked = tools.check_call(example.tool, example.arguments)
        if checked.error is not None:
            raise ConfigError(f"worked example {index} ({example.request!r}): {checked.error}")
        result = await connection.call_tool(checked.name, example.arguments, timeout_s=timeout_s)
        if result.is_error:
            raise ConfigError(
                f"worked example {index} ({example.request!r}): the server "
                f"answered {example.tool} with an error: {result.text[:300]}; "
                "fix the example's arguments"
            )
        messages += _worked(
            index,
            example.request,
            example.tool,
            example.arguments,
            result.text,
            example.answer,
            result_chars,
        )
    if examples:
        return messages
    for tool in tools.tools:
        function = tool["function"]
        name = function["name"]
        arguments = example_arguments(tools.schemas[name])
        if tools.check_call(name, arguments).error is not None:
            continue
        try:
            result = await connection.call_tool(
                tools.server_names[name], arguments, timeout_s=timeout_s
            )
        except TimeoutError:
            continue
        if result.is_error or not result.text.strip():
            continue
        purpose = (function.get("description") or name).split(".")[0].strip()
        described = ", ".join(f"{k} {json.dumps(v)}" for k, v in arguments.items())
        request = f"{purpose}{' for ' + described if described else ''}, please."
        return _worked(0, request, name, arguments, result.text, None, result_chars)
    return []
