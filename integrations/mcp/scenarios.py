"""Where `rlcoach mcp train`'s tasks come from, and the worked examples built from them.

    explored, records = await server_scenarios(spec, found, n=32, sandbox=folder)

By default the server itself supplies them: `explore` calls its safe tools with
synthesized arguments, and `grounded_scenarios` writes requests from the calls that
worked, each with the real result as its answer key. A named generator rephrases those
requests and AutoRL's LLM generation is blended in (its scenarios have no answer key:
the reward falls back to `tool_use_check` for them). `worked_examples` turns training
scenarios into demonstrations of the recorded call — request, call, the server's
answer, a reply that states the key facts — for the SFT warm-up that gives a model
which never calls a tool the reward variance GRPO needs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlcoach.autorl.gameable import GAMEABLE_AT, Gamed
from rlcoach.autorl.grounded import (
    answer_facts,
    cut_result,
    grounded_scenarios,
    rephrase,
    worked_answer,
)
from rlcoach.autorl.types import InputRecord
from rlcoach.errors import ConfigError
from rlcoach.integrations.mcp.connection import ServerSpec
from rlcoach.integrations.mcp.explore import Exploration, explore
from rlcoach.integrations.mcp.safety import ToolSafety
from rlcoach.integrations.mcp.tools import ToolSet
from rlcoach.model import Model
from rlcoach.models.usage import ModelUsage
from rlcoach.trajectory.trajectories import ChatRecord, Message, Tool

__all__ = ["blend_generated", "nothing_to_train_message", "server_scenarios", "worked_examples"]

logger = logging.getLogger(__name__)


async def server_scenarios(
    spec: ServerSpec,
    tools: ToolSet,
    safety: dict[str, ToolSafety],
    n: int,
    *,
    sandbox: Path,
    budget_s: float = 180.0,
    seed: int = 0,
    result_chars: int = 1500,
) -> tuple[Exploration, list[InputRecord]]:
    """Explore the server, then up to `n` grounded scenarios from the calls that worked
    (exploration aims at `n` distinct calls: distinct tasks teach more than rewordings of
    a few, which a small model learns by heart)."""
    allowed = [name for name, s in safety.items() if s.allowed and name in tools.schemas]
    per_tool = min(max(-(-n // max(len(allowed), 1)), 4), 24)
    explored = await explore(
        spec,
        tools,
        safety,
        sandbox=sandbox,
        calls_per_tool=per_tool,
        attempts_per_tool=per_tool * 3,
        budget_s=budget_s,
        seed=seed,
    )
    gamed: list[Gamed] = []
    records = grounded_scenarios(explored.calls, n, result_chars=result_chars, rejected=gamed)
    if not records:
        raise ConfigError(nothing_to_train_message(spec, explored, gamed))
    return explored, records


def nothing_to_train_message(spec: ServerSpec, explored: Exploration, gamed: list[Gamed]) -> str:
    """Why exploring left no task to train on: per tool what it answered, and which
    trivial reply scored on the tasks, with the flags that would help."""
    tools = []
    for report in explored.tools:
        if not report.called:
            tools.append(f"{report.name}: not called ({report.rule})")
        else:
            tools.append(f"{report.name}: {report.calls} calls, {report.worked} with facts")
    if gamed:
        shown = "; ".join(
            f"{g.record.text[:80]!r} scored {g.score:.1f} on the reply {g.reply[:60]!r}"
            for g in gamed[:3]
        )
        missing = (
            f"every one of the {len(gamed)} tasks written from its answers fails the "
            f"trivial-reply check (a reply without the tool scores {GAMEABLE_AT} or more: "
            f"{shown}): their answers hold only values any reply states"
        )
    else:
        missing = (
            f"its {len(explored.calls)} answers with facts gave no task whose answer the "
            "request does not give away"
        )
    return (
        f"MCP server {spec.label!r}: {missing} ({'; '.join(tools)}). The run does not "
        "train on such tasks; give your own with --scenarios-file (AutoRL JSONL, e.g. "
        "from `rlcoach autorl generate --mcp`), a generator that writes them "
        "(--generator-url/--generator-model), or --allow-unsafe-tools if the tools not "
        "called answer what users ask"
    )


async def blend_generated(
    records: list[InputRecord],
    tools: ToolSet,
    generator: Model,
    n: int,
    *,
    context: str | None,
    usage: ModelUsage,
    seed: int,
    progress: bool,
) -> list[InputRecord]:
    """The grounded `records`, their rewordings by `generator`, and up to `n // 2` tasks
    AutoRL's LLM generation writes for the tools (without answer keys)."""
    from rlcoach.autorl.embeddings import minilm_embedder
    from rlcoach.autorl.generate import GenerationError, generate_scenarios

    reworded = await rephrase(records, generator, usage=usage)
    try:
        generated = await generate_scenarios(
            tools.tools,
            max(n // 2, 2),
            generator,
            resources=context,
            usage=usage,
            embed=minilm_embedder(),
            progress=progress,
            config={"seed": seed},
        )
    except GenerationError as e:
        logger.warning("%s; going on with the %d generated", e, len(e.records))
        generated = e.records
    return [*records, *reworded, *generated]


def _steps(record: InputRecord) -> list[dict[str, Any]]:
    """The calls that answer a grounded record, in order: its `steps` (two for a chained
    task), or its one recorded call."""
    raw = record.metadata.get("steps")
    if isinstance(raw, str):
        return list(json.loads(raw))
    return [
        {
            "tool": str(record.metadata["tool"]),
            "arguments": json.loads(str(record.metadata.get("arguments") or "{}")),
            "result": str(record.metadata.get("answer_key", "")),
        }
    ]


def worked_examples(
    records: Sequence[InputRecord],
    tools: ToolSet,
    system_prompt: str,
    *,
    result_chars: int = 1500,
    limit: int = 32,
    offered: Sequence[Tool] | None = None,
) -> list[ChatRecord]:
    """SFT records from grounded scenarios: the system prompt, the request, the recorded
    calls (two for a chained task) each with the server's answer (cut as the agent cuts
    it), and a reply with the key facts. Framed as the agent frames a task, with the
    tools it offers (`offered`, as `agent.offered_tools` writes them; default: `tools`')."""
    shown = list(offered) if offered is not None else tools.tools
    out: list[ChatRecord] = []
    for index, record in enumerate(r for r in records if answer_facts(r)):
        if len(out) >= limit:
            break
        steps = _steps(record)
        if any(step["tool"] not in tools.schemas for step in steps):
            continue
        messages: list[Message] = [
            {"role": "system", "content": system_prompt},
            {"role": "user", "content": record.text},
        ]
        for number, step in enumerate(steps):
            call_id = f"call_{index}_{number}"
            call = {"name": step["tool"], "arguments": json.dumps(step["arguments"])}
            messages += [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": call_id, "type": "function", "function": call}],
                },
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "content": cut_result(str(step["result"]), result_chars),
                },
            ]
        messages.append({"role": "assistant", "content": worked_answer(answer_facts(record))})
        out.append(ChatRecord(messages=messages, tools=shown))
    return out
