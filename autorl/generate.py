"""Generating training inputs with a model: from a task description, or from tools.

`generate_inputs(task, n, generator)` asks the generator for batches of inputs a user of
the agent might give it, as JSON under a strict schema (sent as `response_format`, and
validated anyway), with an instruction to vary topic, wording, length and difficulty and
the most recent inputs listed as ones not to repeat. Each batch is validated record by
record (blank, too short or too long texts are dropped and counted), deduplicated
against everything kept so far (exact and near duplicates, see `dedupe.py`), and
batches continue until `n` distinct records exist or `max_batches` is spent. A malformed
answer is retried with the problem fed back; the generator's calls and tokens go to
`usage`. `generate_scenarios(tools, n, generator)` does the same for tool-using agents:
tasks that need the given tools (OpenAI tool schemas or MCP tool descriptions) without
naming them, each labelled easy / medium / hard.

Any OpenAI-compatible `Model` can generate. The bundled 135M model works as a generator
only in the sense that every guarantee holds (schema, count, no duplicates): its inputs
are short and often off-task. Use a stronger model for real datasets.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import ConfigDict, Field
from tqdm.auto import tqdm

from rlcoach.autorl.dedupe import Embed, deduplicate
from rlcoach.autorl.types import InputRecord
from rlcoach.config import parse_config
from rlcoach.errors import AnswerError, ConfigError, DataError, RLCoachError
from rlcoach.model import Model
from rlcoach.models.answers import json_object
from rlcoach.models.usage import ModelUsage
from rlcoach.trajectory.trajectories import Tool
from rlcoach.validation import Config

__all__ = [
    "GenerationConfig",
    "GenerationError",
    "describe_tools",
    "generate_inputs",
    "generate_scenarios",
]

logger = logging.getLogger(__name__)

DIFFICULTIES = ["easy", "medium", "hard"]


class GenerationError(RLCoachError, RuntimeError):
    """The generator gave less than asked for; `records` holds what it did generate."""

    def __init__(self, message: str, records: list[InputRecord]) -> None:
        super().__init__(message)
        self.records = records


class GenerationConfig(Config):
    """How inputs are asked for. Defaults suit a local generator on the CPU."""

    model_config = ConfigDict(extra="forbid")

    batch_size: int = Field(8, ge=1, le=50)
    """Inputs asked for per call."""
    max_batches: int | None = Field(None, ge=1)
    """Calls before giving up; default four times what `n` needs."""
    max_retries: int = Field(2, ge=0, le=10)
    """Extra attempts per call after a malformed answer or a failed request."""
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    timeout_s: float = Field(180.0, gt=0)
    min_chars: int = Field(8, ge=1)
    max_chars: int = Field(400, ge=16)
    structured_output: bool = True
    """Send the JSON schema as `response_format` (turn off for endpoints that reject it)."""
    near_duplicate_threshold: float = Field(0.7, gt=0.0, le=1.0)
    avoid_examples: int = Field(12, ge=0)
    """How many earlier inputs each prompt lists as not to repeat."""
    seed: int = 0
    price_per_million_tokens: tuple[float, float] | None = None


def _schema(count: int, config: GenerationConfig) -> dict[str, Any]:
    item = {
        "type": "object",
        "additionalProperties": False,
        "required": ["text", "difficulty"],
        "properties": {
            "text": {
                "type": "string",
                "minLength": config.min_chars,
                "maxLength": config.max_chars,
            },
            "difficulty": {"type": "string", "enum": DIFFICULTIES},
        },
    }
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["inputs"],
        "properties": {
            "inputs": {"type": "array", "items": item, "minItems": count, "maxItems": count}
        },
    }


def _answer_items(content: str, key: str = "inputs", expect: type = list) -> Any:
    answer = json_object(content)
    items = answer.get(key) if isinstance(answer, dict) else None
    if not isinstance(items, expect):
        kind = "list" if expect is list else "object"
        raise AnswerError(
            f'the answer has no "{key}" {kind}; fix: answer with a JSON object holding an '
            f'"{key}" {kind}'
        )
    return items


def _function(tool: Tool | Any) -> dict[str, Any]:
    """The name/description/schema part of an OpenAI tool schema, MCP dict or MCP `Tool`."""
    data = tool.model_dump() if hasattr(tool, "model_dump") else dict(tool)
    return data.get("function", data)


def describe_tools(tools: Sequence[Tool | Any]) -> str:
    """One line per tool from OpenAI tool schemas, MCP tool dicts or MCP `Tool` objects."""
    lines = []
    for tool in tools:
        function = _function(tool)
        schema = function.get("parameters") or function.get("inputSchema") or {}
        arguments = ", ".join(schema.get("properties") or {})
        description = " ".join(str(function.get("description") or "").split())
        lines.append(f"- {function.get('name')}({arguments}): {description}")
    return "\n".join(lines)


def _tool_names(tools: Sequence[Tool | Any]) -> list[str]:
    names = [str(_function(tool).get("name", "")) for tool in tools]
    return [n for n in names if n]


def _names_a_tool(text: str, names: list[str]) -> str | None:
    """A tool identifier (snake_case, camelCase, with digits) that `text` spells out."""
    for name in names:
        identifier = (
            "_" in name
            or "-" in name
            or any(c.isdigit() for c in name)
            or re.search(r"[a-z][A-Z]", name) is not None
        )
        if identifier and re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text, re.IGNORECASE):
            return name
    return None


def _record(item: Any, metadata: dict[str, Any], config: GenerationConfig) -> InputRecord | None:
    """A generated item as a record, or None when it is not a usable input."""
    if isinstance(item, str):
        item = {"text": item}
    if not isinstance(item, dict) or not isinstance(item.get("text"), str):
        return None
    text = item["text"].strip()
    if not config.min_chars <= len(text) <= config.max_chars:
        return None
    difficulty = item.get("difficulty")
    try:
        return InputRecord(
            text=text,
            metadata=metadata,
            difficulty=difficulty if difficulty in DIFFICULTIES else "medium",
        )
    except DataError:  # a record the generator wrote badly is dropped
        return None


async def ask_for_json(
    client: Any,
    request: dict[str, Any],
    prompt: list[dict[str, Any]],
    config: GenerationConfig,
    spent: ModelUsage,
    key: str = "inputs",
    expect: type = list,
) -> tuple[Any, str]:
    """`answer[key]` of one call, retrying malformed answers with the problem fed back."""
    import openai

    messages, problem = list(prompt), ""
    for attempt in range(config.max_retries + 1):
        if attempt:
            spent.retries += 1
        spent.calls += 1
        try:
            async with asyncio.timeout(config.timeout_s):
                response = await client.chat.completions.create(
                    messages=messages, timeout=config.timeout_s, **request
                )
        except (openai.APIError, TimeoutError) as e:
            problem = f"the generator request failed: {type(e).__name__}: {e}"
            continue
        spent.count_response(
            response.usage.model_dump() if response.usage else None, config.price_per_million_tokens
        )
        content = (response.choices[0].message.content or "") if response.choices else ""
        try:
            return _answer_items(content, key, expect), ""
        except ValueError as e:
            problem = str(e)
            feedback = (
                f"That answer cannot be used: {problem}. Reply with only the JSON "
                f"object (attempt {attempt + 2} of {config.max_retries + 1})."
            )
            messages = [
                *prompt,
                {"role": "assistant", "content": content},
                {"role": "user", "content": feedback},
            ]
    return None, problem


async def _generate(
    instruction: Callable[[int, list[InputRecord]], str],
    n: int,
    generator: Model,
    config: GenerationConfig,
    usage: ModelUsage | None,
    check: Callable[[str], str | None],
    metadata: dict[str, Any],
    embed: Embed | None,
    progress: bool,
) -> list[InputRecord]:
    if n < 1:
        raise ConfigError(
            f"n={n!r} is below 1: it is how many inputs to generate; fix: pass n >= 1"
        )
    spent = ModelUsage()
    records: list[InputRecord] = []
    max_batches = config.max_batches or 4 * -(-n // config.batch_size)
    client = generator.openai_client(record=False)
    bar = tqdm(total=n, desc="generating inputs", disable=not progress, leave=False)
    dropped = duplicates = 0
    try:
        for batch in range(max_batches):
            if len(records) >= n:
                break
            count = config.batch_size
            prompt = [
                {
                    "role": "system",
                    "content": "You write training inputs for an AI agent. "
                    "You reply with JSON only.",
                },
                {"role": "user", "content": instruction(count, records)},
            ]
            request: dict[str, Any] = {
                "model": generator.served_name,
                "temperature": config.temperature,
                "max_tokens": 64 + count * (config.max_chars // 3 + 24),
                "seed": config.seed + batch,
            }
            if config.structured_output:
                request["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "inputs",
                        "strict": True,
                        "schema": _schema(count, config),
                    },
                }
            items, problem = await ask_for_json(client, request, prompt, config, spent)
            if items is None:
                spent.failed_calls += 1
                logger.warning("generator batch %d gave no usable answer: %s", batch, problem)
                continue
            fresh = []
            for item in items:
                record = _record(item, {**metadata, "batch": batch}, config)
                reason = "not a valid input" if record is None else check(record.text)
                if record is None or reason is not None:
                    dropped += 1
                    logger.debug("dropped a generated input (%s): %r", reason, item)
                    continue
                fresh.append(record)
            kept, removed = deduplicate(
                fresh, threshold=config.near_duplicate_threshold, embed=embed, against=records
            )
            duplicates += len(removed)
            kept = kept[: n - len(records)]
            records += kept
            bar.update(len(kept))
            bar.set_postfix(dropped=dropped, duplicates=duplicates)
    finally:
        bar.close()
        await client.close()
        if usage is not None:
            usage.add(spent)
    if len(records) < n:
        raise GenerationError(
            f"generated {len(records)} distinct valid inputs of the {n} asked for in "
            f"{max_batches} batches ({dropped} invalid, {duplicates} duplicates, "
            f"{spent.failed_calls} unusable answers); fix: raise max_batches or temperature, "
            "or use a stronger generator — the inputs generated so far are in `.records`",
            records,
        )
    return records


def _avoid(records: list[InputRecord], limit: int) -> str:
    if not records or not limit:
        return ""
    listed = "\n".join(f"- {r.text}" for r in records[-limit:])
    return f"\n\nAlready written (do not repeat or paraphrase these):\n{listed}"


def _shape(count: int) -> str:
    return (
        f'Reply with only a JSON object {{"inputs": [{{"text": "...", "difficulty": '
        f'"easy" | "medium" | "hard"}}, ...]}} holding exactly {count} items.'
    )


async def generate_inputs(
    task_description: str,
    n: int,
    generator: Model,
    *,
    config: GenerationConfig | dict[str, Any] | None = None,
    usage: ModelUsage | None = None,
    embed: Embed | None = None,
    progress: bool = True,
) -> list[InputRecord]:
    """`n` distinct, validated inputs for an agent described by `task_description`."""
    config = parse_config(GenerationConfig, config)
    task = " ".join(task_description.split())
    if not task:
        raise ConfigError(
            f"task_description={task_description!r} is empty: generation needs to know what "
            "the agent is for; fix: describe the agent's task in a sentence or more"
        )

    def instruction(count: int, records: list[InputRecord]) -> str:
        return (
            f"The agent's task: {task}\n\nWrite {count} new inputs that a user of this agent "
            "might send it, each a complete request on its own. Make them differ from each "
            "other in topic, wording, length and difficulty (easy, medium, hard)."
            f"{_avoid(records, config.avoid_examples)}\n\n{_shape(count)}"
        )

    def check(text: str) -> str | None:
        return "it repeats the task description" if text.strip() == task else None

    return await _generate(
        instruction, n, generator, config, usage, check, {"kind": "input"}, embed, progress
    )


async def generate_scenarios(
    tools: Sequence[Tool | Any],
    n: int,
    generator: Model,
    *,
    resources: str | None = None,
    config: GenerationConfig | dict[str, Any] | None = None,
    usage: ModelUsage | None = None,
    embed: Embed | None = None,
    progress: bool = True,
) -> list[InputRecord]:
    """`n` tasks that need `tools` without naming them, labelled by difficulty."""
    config = parse_config(GenerationConfig, config)
    if not tools:
        raise ConfigError(
            "tools=[] is empty: scenarios are generated to cover tools; fix: pass the "
            "OpenAI tool schemas or MCP tools to cover"
        )
    listing = describe_tools(tools)
    names = _tool_names(tools)
    context = f"\n\nWhat the tools can reach:\n{resources.strip()}" if resources else ""

    def instruction(count: int, records: list[InputRecord]) -> str:
        return (
            f"An AI agent can use these tools:\n{listing}{context}\n\nWrite {count} tasks a "
            "user might ask this agent that need one or more of the tools to answer. Write "
            "them as the user would: never name a tool or say which to call. Label each: "
            "easy (one tool call), medium (two or three calls), hard (several calls whose "
            f"results must be combined).{_avoid(records, config.avoid_examples)}\n\n"
            f"{_shape(count)}"
        )

    def check(text: str) -> str | None:
        named = _names_a_tool(text, names)
        return f"it names the tool {named!r}" if named else None

    return await _generate(
        instruction, n, generator, config, usage, check, {"kind": "scenario"}, embed, progress
    )
