"""The solvability check: the generator reviews its own inputs before they are kept.

A generated input can be off-task, self-contradictory or impossible with the tools the
agent has; training on it teaches noise (every attempt fails, or the judge rewards
nonsense). `check_solvable` shows the generator a batch of inputs with the task (and the
tools) and asks, per input, whether an agent doing this task could answer it as stated;
the answer is JSON under a strict schema with one required key per input, validated and
retried like every other call. Inputs judged unsolvable are returned separately, with
the reason in their metadata; a batch whose review fails is kept (a failed check loses
no data) and counted in `usage.failed_calls`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from rlcoach.autorl.generate import GenerationConfig, ask_for_json, describe_tools
from rlcoach.autorl.types import InputRecord
from rlcoach.config import parse_config
from rlcoach.model import Model
from rlcoach.models.usage import ModelUsage
from rlcoach.trajectory.trajectories import Tool

__all__ = ["check_solvable"]


def _schema(count: int) -> dict[str, Any]:
    verdict = {
        "type": "object",
        "additionalProperties": False,
        "required": ["solvable", "reason"],
        "properties": {
            "solvable": {"type": "boolean"},
            "reason": {"type": "string", "maxLength": 160},
        },
    }
    labels = [str(i) for i in range(1, count + 1)]
    verdicts = {
        "type": "object",
        "additionalProperties": False,
        "required": labels,
        "properties": dict.fromkeys(labels, verdict),
    }
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["inputs"],
        "properties": {"inputs": verdicts},
    }


async def check_solvable(
    records: Sequence[InputRecord],
    task_description: str,
    generator: Model,
    *,
    tools: Sequence[Tool | Any] = (),
    batch_size: int = 8,
    config: GenerationConfig | dict[str, Any] | None = None,
    usage: ModelUsage | None = None,
) -> tuple[list[InputRecord], list[InputRecord]]:
    """(kept, rejected): inputs the generator judges solvable as stated, and the rest."""
    settings = parse_config(GenerationConfig, config)
    spent = ModelUsage()
    client = generator.openai_client(record=False)
    tool_text = f"\nThe agent's tools:\n{describe_tools(tools)}" if tools else ""

    async def review(batch: list[InputRecord]) -> list[tuple[bool, str] | None]:
        listed = "\n".join(f"{i}. {r.text}" for i, r in enumerate(batch, start=1))
        ask = (
            f"The agent's task: {' '.join(task_description.split())}{tool_text}\n\n"
            f"Inputs:\n{listed}\n\nFor each input, say whether an agent doing this task "
            "could answer it as stated (it is on-task, consistent and possible with what "
            'the agent has). Reply with only a JSON object {"inputs": {"1": {"solvable": '
            'true|false, "reason": "..."}, ...}} with one key per input.'
        )
        request: dict[str, Any] = {
            "model": generator.served_name,
            "temperature": 0.0,
            "max_tokens": 32 + 64 * len(batch),
            "seed": settings.seed,
        }
        if settings.structured_output:
            request["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "verdicts", "strict": True, "schema": _schema(len(batch))},
            }
        prompt = [{"role": "user", "content": ask}]
        items, _ = await ask_for_json(
            client, request, prompt, settings, spent, key="inputs", expect=dict
        )
        if items is None:
            spent.failed_calls += 1
            return [None] * len(batch)
        verdicts: list[tuple[bool, str] | None] = []
        for label in range(1, len(batch) + 1):
            entry = items.get(str(label))
            if isinstance(entry, dict) and isinstance(entry.get("solvable"), bool):
                verdicts.append((entry["solvable"], str(entry.get("reason", ""))))
            else:
                verdicts.append(None)
        return verdicts

    batches = [list(records[i : i + batch_size]) for i in range(0, len(records), batch_size)]
    try:
        results = await asyncio.gather(*(review(b) for b in batches))
    finally:
        await client.close()
        if usage is not None:
            usage.add(spent)
    kept, rejected = [], []
    for batch, verdicts in zip(batches, results, strict=True):
        for record, verdict in zip(batch, verdicts, strict=True):
            if verdict is None or verdict[0]:
                kept.append(record)
            else:
                note = {**record.metadata, "unsolvable": json.dumps(verdict[1])}
                rejected.append(record.model_copy(update={"metadata": note}))
    return kept, rejected
