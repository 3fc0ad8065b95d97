"""Grounded scenarios: requests written from calls that worked, with their answers known.

A small model cannot write useful tasks for tools it has never seen, and a task without
a known answer can only be scored by a judge. But a call that worked is a task with its
answer: `get_current_time(timezone="Asia/Tokyo")` returned a time, so "What is the
current time in Asia/Tokyo?" is a request whose correct answer carries that time.

`grounded_scenarios(calls, n)` turns each `GroundedCall` (a tool, its description and
parameters, the arguments, the real result) into requests from templates built on the
tool's description (or name) and its parameters' names, varied in wording; each argument
value appears verbatim in the request, so the call can be recovered from it. Each request
keeps the call and the two key facts of its result (`facts.key_facts`: times, numbers,
dates, names the request does not already state; two, because a small model learns to
restate two facts long before three) in its metadata: the answer key a checkable
reward needs. A request is kept only if it is solvable — the recorded call answers it:
the call worked, every argument value is in the text, and the result has a fact the
request does not give away — and is not an exact duplicate. `split_by_call` splits train
and held-out by call, so a held-out answer is never trained on in other words.

`rephrase(records, generator)` lets a named generator reword the requests (the values
kept verbatim, checked); the templates remain the source of every task.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rlcoach.autorl.dedupe import deduplicate, normalize_text
from rlcoach.autorl.facts import Fact, key_facts
from rlcoach.autorl.split import split_records
from rlcoach.autorl.types import InputRecord
from rlcoach.model import Model
from rlcoach.models.usage import ModelUsage

__all__ = [
    "GroundedCall",
    "answer_facts",
    "call_key",
    "grounded_scenarios",
    "rephrase",
    "split_by_call",
    "worked_answer",
]


class GroundedCall(BaseModel):
    """A call that worked while exploring a server: the tool, what it was given, what
    it answered."""

    model_config = ConfigDict(extra="forbid")

    tool: str
    """The tool's name as the policy sees it."""
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)
    """The tool's input schema (its parameters' descriptions word the requests)."""
    arguments: dict[str, Any] = Field(default_factory=dict)
    result: str
    """The server's answer, as text."""


def call_key(tool: str, arguments: dict[str, Any]) -> str:
    return f"{tool}:{json.dumps(arguments, sort_keys=True, ensure_ascii=False)}"


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        return ", ".join(str(v) for v in value)
    return json.dumps(value, ensure_ascii=False)


def _leaves(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, list):
        return [leaf for v in value for leaf in _leaves(v)]
    if isinstance(value, bool) or value is None:
        return []
    return [str(value)]


def _purpose(call: GroundedCall) -> str:
    """The tool's first descriptive sentence, lower-cased, or its name in words."""
    first = re.split(r"(?<=[.!?])\s|\n", call.description.strip())[0].strip().rstrip(".!?")
    if not first or len(first) > 120:
        first = re.sub(r"[_\-]+", " ", re.sub(r"([a-z])([A-Z])", r"\1 \2", call.tool))
    # "Calculates/evaluates the expression" -> "calculate the expression"
    verb, _, rest = first.partition(" ")
    verb = verb.split("/")[0]
    if re.fullmatch(r"[A-Za-z]+(?:sh|ch|x|ss)es", verb):
        verb = verb[:-2]
    elif re.fullmatch(r"[A-Za-z]+[^su]s", verb):
        verb = verb[:-1]
    first = f"{verb} {rest}".strip()
    return first[0].lower() + first[1:] if first else call.tool


def _label(name: str, schema: dict[str, Any]) -> str:
    return re.sub(r"[_\-]+", " ", re.sub(r"([a-z])([A-Z])", r"\1 \2", name)).lower()


def _requests(call: GroundedCall) -> list[str]:
    purpose = _purpose(call)
    properties = call.parameters.get("properties", {})
    pairs = [(_label(k, properties.get(k, {})), _shown(v)) for k, v in call.arguments.items()]
    if not pairs:
        return [
            f"{purpose[0].upper()}{purpose[1:]}.",
            f"Please {purpose}.",
            f"Can you {purpose}?",
            f"I need you to {purpose}.",
        ]
    with_names = ", ".join(f"{label} {value}" for label, value in pairs)
    values = ", ".join(value for _, value in pairs)
    stated = " ".join(f"The {label} is {value}." for label, value in pairs)
    return [
        f"{purpose[0].upper()}{purpose[1:]} for {with_names}.",
        f"Please {purpose}: {values}.",
        f"Can you {purpose}? {stated}",
        f"I need to {purpose}, with {with_names}.",
        f"{with_names[0].upper()}{with_names[1:]}: {purpose}, please.",
    ]


def answer_facts(record: InputRecord) -> list[Fact]:
    """The key facts a record's metadata carries (empty for a record without a key)."""
    raw = record.metadata.get("facts")
    return [Fact(*item) for item in json.loads(raw)] if isinstance(raw, str) else []


def worked_answer(facts: Sequence[Fact]) -> str:
    """A final answer that states the facts as the result showed them."""
    shown = list(dict.fromkeys(f.display() for f in facts))
    return f"The answer: {'; '.join(shown)}." if shown else "Done."


def grounded_scenarios(
    calls: Sequence[GroundedCall], n: int, *, fact_limit: int = 2, result_chars: int = 1500
) -> list[InputRecord]:
    """Up to `n` solvable, distinct requests from `calls` (see the module docstring),
    spread over the calls: variant 1 of every call, then variant 2, and so on."""
    per_call: list[list[InputRecord]] = []
    for call in calls:
        key = call_key(call.tool, call.arguments)
        variants = []
        for text in _requests(call):
            if not all(leaf in text for leaf in _leaves(call.arguments)):
                continue  # the call could not be recovered from this wording
            facts = key_facts(call.result, known=text, limit=fact_limit)
            if not facts:
                continue  # nothing in the answer that the request does not give away
            variants.append(
                InputRecord(
                    text=text,
                    difficulty="easy",
                    metadata={
                        "source": "grounded",
                        "tool": call.tool,
                        "arguments": json.dumps(call.arguments, ensure_ascii=False),
                        "call": key,
                        "facts": json.dumps([[f.kind, f.value, f.shown] for f in facts]),
                        "answer_key": call.result[:result_chars],
                    },
                )
            )
        per_call.append(variants)
    ordered = [
        variants[i]
        for i in range(max((len(v) for v in per_call), default=0))
        for variants in per_call
        if i < len(variants)
    ]
    kept, _ = deduplicate(ordered, threshold=1.0)
    return kept[:n]


def split_by_call(
    records: Sequence[InputRecord], eval_fraction: float, seed: int = 0
) -> tuple[list[InputRecord], list[InputRecord]]:
    """(train, held out) with every request of one call on the same side; both sides get
    a call when there are two or more (records without a call split by id)."""

    def key(record: InputRecord) -> str:
        return str(record.metadata.get("call") or record.id)

    train, held_out = split_records(records, eval_fraction, seed, key=key)
    keys = list(dict.fromkeys(key(r) for r in records))
    if len(keys) >= 2 and (not train or not held_out):
        moved = keys[-1] if not held_out else keys[0]
        side = [r for r in records if key(r) == moved]
        rest = [r for r in records if key(r) != moved]
        train, held_out = (rest, side) if not held_out else (side, rest)
    return train, held_out


async def rephrase(
    records: Sequence[InputRecord],
    generator: Model,
    *,
    usage: ModelUsage | None = None,
    timeout_s: float = 120.0,
    concurrency: int = 8,
) -> list[InputRecord]:
    """Rewordings of grounded requests by `generator`, each keeping every argument value
    verbatim (checked; a rewording that drops one, or a failed call, is left out)."""
    import openai

    client = generator.openai_client(record=False)
    spent = ModelUsage()
    gate = asyncio.Semaphore(concurrency)

    async def one(record: InputRecord) -> InputRecord | None:
        leaves = _leaves(json.loads(str(record.metadata.get("arguments") or "{}")))
        keep = "; ".join(leaves) or "(none)"
        ask = (
            f"Reword this request to an assistant as a user would say it, in one sentence. "
            f"Keep these values exactly as written: {keep}. Do not name any tool.\n\n"
            f"Request: {record.text}\n\nReply with the reworded request only."
        )
        async with gate:
            spent.calls += 1
            try:
                async with asyncio.timeout(timeout_s):
                    response = await client.chat.completions.create(
                        model=generator.served_name,
                        messages=[{"role": "user", "content": ask}],
                        temperature=0.7,
                        max_tokens=96,
                    )
            except (openai.APIError, TimeoutError):
                spent.failed_calls += 1
                return None
        spent.count_response(response.usage.model_dump() if response.usage else None, None)
        text = (response.choices[0].message.content or "").strip().strip('"')
        if not text or not all(leaf in text for leaf in leaves):
            return None
        facts = answer_facts(record)
        if any(
            normalize_text(f.value) and normalize_text(f.value) in normalize_text(text)
            for f in facts
        ):
            return None  # the rewording gives the answer away
        return InputRecord(
            text=text,
            difficulty=record.difficulty,
            metadata={**record.metadata, "source": "grounded, rephrased"},
        )

    try:
        results = await asyncio.gather(*(one(r) for r in records))
    finally:
        await client.close()
        if usage is not None:
            usage.add(spent)
    kept, _ = deduplicate([r for r in results if r is not None], threshold=1.0, against=records)
    return kept
