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
request does not give away — and is not an exact duplicate. Every result is read as the
agent is shown it (`cut_result` at `result_chars`). `split_by_call` splits train
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
from rlcoach.autorl.facts import Fact, key_facts, keyed_records
from rlcoach.autorl.gameable import Gamed, common_facts, drop_gameable
from rlcoach.autorl.split import split_by_share
from rlcoach.autorl.types import InputRecord
from rlcoach.model import Model
from rlcoach.models.usage import ModelUsage

_SELECT = re.compile(r"\s*(?:select|with)\s", re.IGNORECASE)

__all__ = [
    "GroundedCall",
    "answer_facts",
    "call_key",
    "cut_result",
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
    question: str = ""
    """A question about the data that this call answers, when exploring wrote the call for
    one (a SELECT on real values); the request is then that question, not a template."""
    after: int | None = None
    """The index, among the same exploration's calls, of the call whose answer supplied
    this call's values (a listing's name, a row's id): a chain of two calls."""


def cut_result(text: str, limit: int) -> str:
    """A tool's result as an agent is shown it: cut to `limit` characters, the cut marked
    with how much was left out (`rlcoach mcp` agents' `result_chars`). The grounded writer
    reads results the same way, so no request needs what the agent cannot see."""
    kept = _kept_chars(text, limit)
    if kept == len(text):
        return text
    return text[:kept] + _cut_marker(len(text) - kept, limit)


def _cut_marker(left_out: int, limit: int) -> str:
    return f"\n[... {left_out} more characters cut by rlcoach; result_chars={limit}]"


def _kept_chars(text: str, limit: int) -> int:
    """How much of `text` `cut_result` keeps."""
    if len(text) <= limit:
        return len(text)
    return max(limit - len(_cut_marker(len(text), limit)), 0)


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


def _kept_values(record: InputRecord) -> list[str]:
    """The values a rewording must keep: the call's argument values the request states,
    and for a query (SQL) the quoted literals of it that the request states."""
    leaves = _leaves(json.loads(str(record.metadata.get("arguments") or "{}")))
    kept = [leaf for leaf in leaves if leaf in record.text]
    for leaf in leaves:
        if leaf not in record.text:
            kept += [v for v in re.findall(r"'((?:[^']|'')*)'", leaf) if v and v in record.text]
    return list(dict.fromkeys(kept))


def answer_facts(record: InputRecord) -> list[Fact]:
    """The key facts a record's metadata carries (empty for a record without a key)."""
    raw = record.metadata.get("facts")
    return [Fact(*item) for item in json.loads(raw)] if isinstance(raw, str) else []


def worked_answer(facts: Sequence[Fact]) -> str:
    """A final answer that states the facts as the result showed them."""
    shown = list(dict.fromkeys(f.display() for f in facts))
    return f"The answer: {'; '.join(shown)}." if shown else "Done."


def _question_requests(call: GroundedCall) -> list[str]:
    """Wordings of a question about the data (the question keeps its values)."""
    question = call.question.strip()
    lowered = question[0].lower() + question[1:]
    return [
        question,
        f"Quick question about the data: {question}",
        f"Can you check the database? {question}",
        f"Using the database, tell me: {lowered}",
    ]


def _record_questions(call: GroundedCall) -> list[tuple[str, list[Fact], str]]:
    """Questions about one record of a listing the call answered (a commit's author, a
    row's price), naming the record by a field whose value no other record has: "Show
    the commit logs (/srv/repo), and tell me: what is the author of the one whose message
    is "Note the tea"?" -> the fact `Grace Hopper`. (text, facts, the naming value) for
    at most three records, one question each."""
    records = keyed_records(call.result)
    if len(records) < 2:
        return []
    given = [v for v in _leaves(call.arguments) if v.strip()]
    purpose = _purpose(call) + (f" ({', '.join(given)})" if given else "")

    def names_it(key: str) -> bool:  # a value a person would say: unique words
        values = [r.get(key, "") for r in records]
        return (
            len(set(values)) == len(values)
            and all(re.search(r"[A-Za-z]{2}", v) and len(v) <= 60 for v in values)
            and not all(re.fullmatch(r"[0-9a-f]{7,}", v) for v in values)
        )

    keys = [k for k in records[0] if all(k in r for r in records)]
    namers = sorted(
        (k for k in keys if names_it(k)), key=lambda k: -sum(" " in r[k] for r in records)
    )
    if not namers:
        return []
    namer = namers[0]
    out = []
    # from the second record on: a listing's first row is the least telling (an `id`)
    for index, record in enumerate([*records[1:], records[0]][:3]):
        asked_keys = sorted(
            (k for k in keys if k != namer and record[k].strip()), key=_asked_rank(record)
        )
        if not asked_keys:
            break
        asked_key = asked_keys[index % len(asked_keys)]
        question = (
            f"what is the {asked_key.lower()} of the one whose {namer.lower()} is "
            f'"{record[namer]}"?'
        )
        facts = key_facts(record[asked_key], known=question, limit=2) or [
            Fact("text", record[asked_key])
        ]
        text = f"{purpose[0].upper()}{purpose[1:]}, and tell me: {question}"
        out.append((text, facts, record[namer]))
    return out


def _asked_rank(record: dict[str, str]) -> Any:
    """What to ask about a record first: words (a name, a type, a date), then amounts,
    then 0/1 flags, then opaque ids (a commit's hash)."""

    def rank(key: str) -> int:
        value = record[key].strip()
        if re.fullmatch(r"[0-9a-f]{7,}", value):
            return 3
        if re.fullmatch(r"-?[\d.,]+", value):
            return 2 if value in ("0", "1") else 1
        return 0

    return rank


_ORDINALS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth"]


def _chained_requests(call: GroundedCall, first: GroundedCall, first_cut: bool) -> list[str]:
    """Two-step requests: `first`'s answer names the value `call` was made with, and the
    request says which one by its place in that answer, never by the value itself (its
    place from the start: "last" only in a listing the agent is shown whole, not
    `first_cut`)."""
    from rlcoach.autorl.facts import listed_items

    items = listed_items(first.result)
    leaves = _leaves(call.arguments)

    def place_of(value: str) -> int | None:
        # a listing may name the item as the call takes it, or by its last path part
        for index, item in enumerate(items):
            if value in item or value.rsplit("/", 1)[-1] in item:
                return index
        return None

    given = [v for v in _leaves(first.arguments) if v.strip()]
    found = [v for v in leaves if v not in given]  # the rest (a repo's path) is stated
    places = [place_of(v) for v in found]
    if not found or None in places:
        return []  # every value not stated must come from the listing
    place = places[0]
    assert place is not None
    ordinal = "last" if place == len(items) - 1 and place >= 3 and not first_cut else None
    if ordinal is None and place < len(_ORDINALS):
        ordinal = _ORDINALS[place]
    if ordinal is None:
        return []
    step_one, step_two = _purpose(first), _purpose(call)
    if given:  # the first call's own values are stated, so it can be made
        step_one += f" ({', '.join(given)})"
    return [
        f"{step_one[0].upper()}{step_one[1:]}, then {step_two} for the {ordinal} one listed.",
        f"First {step_one}. Then, for the {ordinal} item of that list, {step_two}.",
        f"Take the {ordinal} result when you {step_one}, and {step_two} for it.",
    ]


def _record(
    call: GroundedCall, text: str, facts: list[Fact], first: GroundedCall | None, chars: int
) -> InputRecord:
    steps = [first, call] if first is not None else [call]
    return InputRecord(
        text=text,
        difficulty="medium" if first is not None else "easy",
        metadata={
            "source": "grounded, two calls" if first is not None else "grounded",
            "tool": call.tool,
            "arguments": json.dumps(call.arguments, ensure_ascii=False),
            "call": call_key(call.tool, call.arguments),
            "facts": json.dumps([[f.kind, f.value, f.shown] for f in facts]),
            "answer_key": call.result[:chars],
            "steps": json.dumps(
                [
                    {"tool": c.tool, "arguments": c.arguments, "result": c.result[:chars]}
                    for c in steps
                ],
                ensure_ascii=False,
            ),
        },
    )


def grounded_scenarios(
    calls: Sequence[GroundedCall],
    n: int,
    *,
    fact_limit: int = 2,
    result_chars: int = 1500,
    rejected: list[Gamed] | None = None,
) -> list[InputRecord]:
    """Up to `n` solvable, distinct requests from `calls` (see the module docstring),
    spread over the calls: variant 1 of every call, then variant 2, and so on; the
    multi-step ones (a call whose values came from an earlier call's answer) first.
    Requests a trivial reply scores 0.2 or more on are dropped (`gameable.py`) and, with
    `rejected`, appended to it with the reply that beat them."""
    # what the agent is shown of each result (its start, `cut_result`): every item, record
    # and fact a request needs comes from it
    kept = [_kept_chars(c.result, result_chars) for c in calls]
    cut = [k < len(c.result) for k, c in zip(kept, calls, strict=True)]
    calls = [
        c.model_copy(update={"result": c.result[:k]}) for k, c in zip(kept, calls, strict=True)
    ]
    common = common_facts(calls)
    per_call: list[list[InputRecord]] = []
    chained: list[list[InputRecord]] = []
    for call in calls:
        first = calls[call.after] if call.after is not None and call.after < len(calls) else None
        options: list[tuple[str, GroundedCall | None]] = []
        questions: list[InputRecord] = []  # about what a listing holds, before the templates
        if call.question:
            options = [(t, first) for t in _question_requests(call)]
        elif any(_is_query(call.arguments)):
            continue  # a bare SELECT that answers no question: a step, not a task
        else:
            if first is not None:  # the two-call task, and the one-call task beside it
                assert call.after is not None
                options = [(t, first) for t in _chained_requests(call, first, cut[call.after])]
            for text, asked, about in _record_questions(call):
                record = _record(call, text, asked, None, result_chars)
                metadata = {**record.metadata, "about": about}  # the record's naming value
                questions.append(record.model_copy(update={"metadata": metadata}))
            options += [(t, None) for t in _requests(call)]
        variants: dict[bool, list[InputRecord]] = {True: [], False: questions}
        for text, before in options:
            recoverable = all(leaf in text for leaf in _leaves(call.arguments))
            if before is None and not call.question and not recoverable:
                continue  # the call could not be recovered from this wording
            candidates = key_facts(call.result, known=text, limit=fact_limit + 8)
            share = {
                f: (
                    common.get((call.tool, f.kind, f.normal()), 0.0),
                    common.get(("*", f.kind, f.normal()), 0.0),
                )
                for f in candidates
            }
            # the facts that distinguish this answer from the tool's others (and then from
            # every other call's), rarest first
            facts = sorted((f for f in candidates if share[f][0] <= 0.5), key=share.__getitem__)
            facts = facts[:fact_limit]
            if not facts:
                continue  # nothing in the answer that the request does not give away
            variants[before is not None].append(_record(call, text, facts, before, result_chars))
        chained.append(variants[True])
        per_call.append(variants[False])
    multi = _round_robin(chained)
    single = _round_robin(per_call)
    multi, _ = deduplicate(multi, threshold=1.0)
    single, _ = deduplicate(single, threshold=1.0, against=multi)
    kept, gamed = drop_gameable([*multi, *single])
    if rejected is not None:
        rejected += gamed
    # (by source: the check may have taken facts out of a record, making it a new one)
    multi = [r for r in kept if r.metadata["source"] == "grounded, two calls"]
    single = [r for r in kept if r.metadata["source"] != "grounded, two calls"]
    # up to half multi-step, the rest single calls, then whichever remains
    take = multi[: n // 2] + single[: n - min(len(multi), n // 2)]
    take += [r for r in kept if r not in take][: n - len(take)]
    return take


def _round_robin(groups: list[list[InputRecord]]) -> list[InputRecord]:
    """Variant 1 of every group, then variant 2, and so on."""
    return [
        variants[i]
        for i in range(max((len(v) for v in groups), default=0))
        for variants in groups
        if i < len(variants)
    ]


def _is_query(arguments: dict[str, Any]) -> list[bool]:
    return [isinstance(v, str) and bool(_SELECT.match(v)) for v in arguments.values()]


def split_by_call(
    records: Sequence[InputRecord], eval_fraction: float, seed: int = 0
) -> tuple[list[InputRecord], list[InputRecord]]:
    """(train, held out) with every request of one call on the same side, the held-out
    side holding about `eval_fraction` of the requests (whole calls, `split_by_share`)
    and both sides a call when there are two or more (records without a call alone)."""
    return split_by_share(
        records, eval_fraction, seed, key=lambda r: str(r.metadata.get("call") or r.id)
    )


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
        leaves = _kept_values(record)
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
