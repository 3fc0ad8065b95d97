"""A system prompt for the agent, written by the generator from the task description.

Optional: a dataset records the system prompt it was generated with (`dataset.json`), so
training and evaluation use the same one. The answer is plain text; an overlong or cut-off
answer keeps its first whole sentences that fit, and an empty or too short one (or an
overlong one with no whole sentence that fits) is retried with the problem fed back.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import Any

from rlcoach.autorl.generate import GenerationError
from rlcoach.autorl.types import InputRecord
from rlcoach.model import Model
from rlcoach.models.usage import ModelUsage

__all__ = ["generate_system_prompt"]

_MIN_TRIMMED = 40
"""Shortest trimmed prompt kept (characters): shorter, the answer is asked for again."""
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)")


def _whole_sentences(text: str, max_chars: int) -> str:
    """The longest run of whole sentences at the start of `text` within `max_chars`."""
    ends = [m.end() for m in _SENTENCE_END.finditer(text) if m.end() <= max_chars]
    return text[: ends[-1]].strip() if ends else ""


async def generate_system_prompt(
    task_description: str,
    generator: Model,
    *,
    examples: Sequence[InputRecord] = (),
    max_chars: int = 1200,
    max_retries: int = 2,
    timeout_s: float = 120.0,
    usage: ModelUsage | None = None,
) -> str:
    """A system prompt (at most `max_chars`) for an agent doing `task_description`."""
    import openai

    listed = "".join(f"\n- {r.text}" for r in examples[:5])
    ask = (
        f"Write the system prompt for an AI agent with this task: "
        f"{' '.join(task_description.split())}\n"
        + (f"Users will send inputs such as:{listed}\n" if listed else "")
        + f"Say what the agent does and how it should answer, in at most {max_chars} "
        "characters. Reply with the system prompt only."
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": ask}]
    spent = ModelUsage()
    client = generator.openai_client(record=False)
    problem = ""
    try:
        for attempt in range(max_retries + 1):
            if attempt:
                spent.retries += 1
            spent.calls += 1
            try:
                async with asyncio.timeout(timeout_s):
                    response = await client.chat.completions.create(
                        model=generator.served_name,
                        messages=messages,
                        temperature=0.7,
                        max_tokens=max_chars // 3 + 32,
                        timeout=timeout_s,
                    )
            except (openai.APIError, TimeoutError) as e:
                problem = f"the generator request failed: {type(e).__name__}: {e}"
                continue
            spent.count_response(response.usage.model_dump() if response.usage else None, None)
            choice = response.choices[0]
            text = (choice.message.content or "").strip()
            if choice.finish_reason == "length" or len(text) > max_chars:
                # A small generator rambles on: its first whole sentences that fit are a
                # usable prompt; only when none fit is the answer sent back.
                kept = _whole_sentences(text, max_chars)
                if len(kept) >= _MIN_TRIMMED:
                    return kept
                problem = f"the prompt is longer than {max_chars} characters"
            elif len(text) < 20:
                problem = "the prompt is empty or too short to guide the agent"
            else:
                return text
            messages = [
                {"role": "user", "content": ask},
                {"role": "assistant", "content": text},
                {
                    "role": "user",
                    "content": f"That cannot be used: {problem}. Write it "
                    f"again (attempt {attempt + 2} of {max_retries + 1}).",
                },
            ]
        spent.failed_calls += 1
        raise GenerationError(
            f"the generator wrote no usable system prompt in "
            f"{max_retries + 1} attempts; the last problem: {problem}",
            [],
        )
    finally:
        await client.close()
        if usage is not None:
            usage.add(spent)
