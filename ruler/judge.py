"""Asking the judge: prompts, the answer schema, parsing, retries, the cache, usage.

One `JudgeSession` serves one `score` call: it holds the OpenAI client (a client whose
calls are never recorded into a rollout), the cache and the usage counters. For each
ordering it builds the prompt — the rubric, the shared context, then the trajectories
in that ordering under ids 1..m — and asks either for the JSON answer (`json` mode) or
for one digit per trajectory (`probs` mode). An unusable answer is retried with the
problem fed back to the judge; a call that fails every attempt raises `JudgeError`,
which the caller records.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from typing import Any

from rlcoach.errors import AnswerError, RLCoachError
from rlcoach.model import Model
from rlcoach.models.answers import json_object
from rlcoach.ruler.cache import JudgeCache
from rlcoach.ruler.config import RulerConfig
from rlcoach.ruler.render import RenderedGroup
from rlcoach.ruler.types import JudgeUsage
from rlcoach.trajectory.trajectories import Message

__all__ = [
    "AnswerError",
    "JudgeError",
    "JudgeSession",
    "answer_schema",
    "build_prompt",
    "parse_digit_answer",
    "parse_json_answer",
]

logger = logging.getLogger(__name__)

SYSTEM = (
    "You judge attempts by an AI agent. You are shown several trajectories, each an "
    "attempt at the same task, and score each from 0 to 1 by comparing them with each "
    "other, following the rubric."
)

# Anchors for the single-digit answer: small judges copy the format of the turns before.
DIGIT_EXAMPLES: list[Message] = [
    {
        "role": "user",
        "content": "Example: a trajectory that fully achieves the task. Score (one digit, 0-9):",
    },
    {"role": "assistant", "content": "9"},
    {
        "role": "user",
        "content": "Example: a trajectory that ignores the task. Score (one digit, 0-9):",
    },
    {"role": "assistant", "content": "0"},
]


class JudgeError(RLCoachError, RuntimeError):
    """The judge gave no usable answer after every retry (or the request cannot work)."""


def build_prompt(rendered: RenderedGroup, order: list[int], rubric: str) -> list[Message]:
    """System + user messages showing the bodies in `order` under ids 1..len(order)."""
    blocks = [
        f'<trajectory id="{label}">\n{rendered.bodies[body]}\n</trajectory>'
        for label, body in enumerate(order, start=1)
    ]
    user = (
        f"Rubric:\n{rubric}\n\n"
        f"All {len(order)} trajectories start from this shared context:\n"
        f"<shared_context>\n{rendered.context}\n</shared_context>\n\n"
        "What each trajectory did after it:\n" + "\n\n".join(blocks)
    )
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def _labels(count: int) -> list[str]:
    return [str(label) for label in range(1, count + 1)]


def answer_schema(count: int, explanation_max_chars: int) -> dict[str, Any]:
    """The JSON schema of the answer: one required key per trajectory id, no others."""
    entry: dict[str, Any] = {"type": "object", "additionalProperties": False}
    if explanation_max_chars:
        entry["properties"] = {
            "explanation": {"type": "string", "maxLength": explanation_max_chars},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
        }
        entry["required"] = ["explanation", "score"]
    else:
        entry["properties"] = {"score": {"type": "number", "minimum": 0, "maximum": 1}}
        entry["required"] = ["score"]
    labels = _labels(count)
    return {
        "type": "object",
        "properties": dict.fromkeys(labels, entry),
        "required": labels,
        "additionalProperties": False,
    }


def json_instruction(count: int, explanation_max_chars: int) -> str:
    ids = ", ".join(f'"{label}"' for label in _labels(count))
    if explanation_max_chars:
        shape = '{"explanation": "<one short sentence>", "score": <number from 0 to 1>}'
    else:
        shape = '{"score": <number from 0 to 1>}'
    return (
        f"Score every trajectory. Reply with only a JSON object with exactly the keys "
        f"{ids} (one per trajectory id), each mapping to {shape}."
    )


def parse_json_answer(content: str, count: int) -> dict[str, tuple[float, str]]:
    """`{id: (score, explanation)}` for ids 1..count, or `AnswerError` saying what is wrong."""
    answer = json_object(content)
    if not isinstance(answer, dict):
        raise AnswerError(f"the answer must be a JSON object, not {type(answer).__name__}")
    labels = _labels(count)
    missing = [label for label in labels if label not in answer]
    unexpected = [key for key in answer if key not in labels]
    if missing or unexpected:
        raise AnswerError(
            f"the answer must have exactly the keys {labels} (one per trajectory); "
            f"missing {missing}, unexpected {unexpected}"
        )
    parsed = {}
    for label in labels:
        entry = answer[label]
        value = entry.get("score") if isinstance(entry, dict) else entry
        explanation = entry.get("explanation", "") if isinstance(entry, dict) else ""
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                value = float(value)
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            raise AnswerError(f"trajectory {label}'s score must be a number, got {value!r}")
        if not 0.0 <= value <= 1.0:
            raise AnswerError(
                f"trajectory {label}'s score is {value}; scores must be between 0 and 1"
            )
        parsed[label] = (float(value), str(explanation))
    return parsed


def parse_digit_answer(choice: dict[str, Any], min_probability: float) -> tuple[float, float]:
    """(expected digit / 9, probability on digits) from the first sampled token's logprobs."""
    entries = ((choice.get("logprobs") or {}).get("content")) or []
    if not entries:
        raise AnswerError("the judge returned no logprobs; it must support `top_logprobs`")
    first = entries[0]
    alternatives = first.get("top_logprobs") or [first]
    mass = [0.0] * 10
    for alternative in alternatives:
        token = str(alternative.get("token", "")).strip()
        if len(token) == 1 and token.isdigit():
            mass[int(token)] += math.exp(float(alternative["logprob"]))
    total = sum(mass)
    if total < max(min_probability, 1e-12):
        said = str(first.get("token", ""))
        raise AnswerError(f"the answer began with {said!r}, not a digit from 0 to 9")
    expected = sum(digit * p for digit, p in enumerate(mass)) / total
    return expected / 9.0, total


class JudgeSession:
    """Judge calls for one `score` call: client, cache, retries and usage."""

    def __init__(self, judge: Model, config: RulerConfig) -> None:
        self.judge = judge
        self.config = config
        self.usage = JudgeUsage()
        self.cache = (
            JudgeCache(config.cache_dir, config.cache_max_entries)
            if config.cache_dir is not None
            else None
        )
        self.url = judge.api_base
        self._client = judge.openai_client(record=False)
        self._semaphore = asyncio.Semaphore(config.max_concurrency)

    async def close(self) -> None:
        await self._client.close()

    async def complete(self, request: dict[str, Any]) -> dict[str, Any]:
        """One chat completion as JSON, from the cache when this exact request was made."""
        key = JudgeCache.key(self.url, request) if self.cache is not None else ""
        if self.cache is not None and (cached := self.cache.get(key)) is not None:
            self.usage.cached_calls += 1
            return cached
        standard = {k: v for k, v in request.items() if k != "extra_body"}
        self.usage.calls += 1
        async with self._semaphore:
            async with asyncio.timeout(self.config.timeout_s):
                response = await self._client.chat.completions.create(
                    **standard,
                    extra_body=request.get("extra_body") or None,
                    timeout=self.config.timeout_s,
                )
        data = response.model_dump(exclude_none=True)
        self.usage.count_response(data.get("usage"), self.config.price_per_million_tokens)
        if self.cache is not None:
            self.usage.cache_evicted += self.cache.put(key, data)
        return data

    def _request(self, messages: list[Message], **fields: Any) -> dict[str, Any]:
        request: dict[str, Any] = {
            "model": self.judge.served_name,
            "messages": messages,
            "temperature": self.config.temperature,
            "seed": self.config.seed,
            **fields,
        }
        if self.config.extra_body:
            request["extra_body"] = dict(self.config.extra_body)
        return request

    async def _ask(
        self, messages: list[Message], fields: dict[str, Any], parse: Any, retry_hint: str
    ) -> Any:
        """Ask until `parse(choice_json)` succeeds; feed each unusable answer back."""
        import openai

        conversation = list(messages)
        problem = ""
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                self.usage.retries += 1
            try:
                data = await self.complete(self._request(conversation, **fields))
            except openai.APIStatusError as e:
                if e.status_code in (400, 401, 403, 404, 422):
                    self.usage.failed_calls += 1
                    raise JudgeError(_status_hint(e, self.judge, self.config)) from e
                problem = f"the judge request failed: {type(e).__name__}: {e}"
                continue
            except (openai.APIError, TimeoutError) as e:
                problem = f"the judge request failed: {type(e).__name__}: {e}"
                logger.info("judge call failed (%s); attempt %d", problem, attempt + 1)
                continue
            choices = data.get("choices") or []
            if not choices:
                problem = "the judge's response has no choices"
                continue
            try:
                return parse(choices[0])
            except AnswerError as e:
                problem = str(e)
                said = (choices[0].get("message") or {}).get("content") or ""
                # The attempt number keeps each retry a distinct request, so the cache
                # never replays the unusable answer to the retry itself.
                feedback = (
                    f"That answer cannot be used: {problem}. {retry_hint} "
                    f"(attempt {attempt + 2} of {self.config.max_retries + 1})"
                )
                conversation = [
                    *messages,
                    {"role": "assistant", "content": said},
                    {"role": "user", "content": feedback},
                ]
        self.usage.failed_calls += 1
        raise JudgeError(
            f"the judge {self.judge.served_name!r} gave no usable answer in "
            f"{self.config.max_retries + 1} attempts; the last problem: {problem}"
        )

    async def json_scores(
        self, rendered: RenderedGroup, order: list[int], rubric: str
    ) -> tuple[list[float], list[str]]:
        """Scores and explanations, in `order`, from one JSON answer."""
        count, chars = len(order), self.config.explanation_max_chars
        instruction = json_instruction(count, chars)
        messages = build_prompt(rendered, order, rubric)
        messages[-1]["content"] += "\n\n" + instruction
        fields: dict[str, Any] = {
            "max_tokens": self.config.max_tokens or 64 + count * (40 + chars // 3)
        }
        if self.config.structured_output:
            fields["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": "ruler_scores",
                    "strict": True,
                    "schema": answer_schema(count, chars),
                },
            }

        def parse(choice: dict[str, Any]) -> dict[str, tuple[float, str]]:
            content = (choice.get("message") or {}).get("content") or ""
            if choice.get("finish_reason") == "length":
                raise AnswerError("the answer was cut off at max_tokens; keep explanations short")
            return parse_json_answer(content, count)

        parsed = await self._ask(messages, fields, parse, instruction)
        labels = _labels(count)
        return [parsed[label][0] for label in labels], [parsed[label][1] for label in labels]

    async def digit_scores(
        self, rendered: RenderedGroup, order: list[int], rubric: str
    ) -> tuple[list[float], list[str]]:
        """One single-digit call per trajectory; scores and a note, in `order`."""
        base = build_prompt(rendered, order, rubric)
        base[-1]["content"] += (
            "\n\nYou will be asked for each trajectory's score as one digit from 0 (worst) "
            "to 9 (best)."
        )
        fields = {"max_tokens": 1, "logprobs": True, "top_logprobs": self.config.top_logprobs}

        def parse(choice: dict[str, Any]) -> tuple[float, float]:
            return parse_digit_answer(choice, self.config.min_digit_probability)

        async def one(label: int) -> tuple[float, float]:
            question = {"role": "user", "content": f"Trajectory {label}. Score (one digit, 0-9):"}
            messages = [
                *base,
                {"role": "assistant", "content": "Understood."},
                *DIGIT_EXAMPLES,
                question,
            ]
            return await self._ask(messages, fields, parse, "Answer with one digit from 0 to 9.")

        answers = await asyncio.gather(*(one(label) for label in range(1, len(order) + 1)))
        notes = [
            f"expected digit {score * 9:.2f} of 9 (probability on digits {mass:.2f})"
            for score, mass in answers
        ]
        return [score for score, _ in answers], notes


def _status_hint(error: Any, judge: Model, config: RulerConfig) -> str:
    hint = f"the judge {judge.served_name!r} at {judge.base_url or 'the policy endpoint'} "
    hint += f"rejected the request ({error.status_code}): {error.message}"
    if error.status_code == 400 and config.mode == "json" and config.structured_output:
        hint += (
            "; if this endpoint does not support `response_format` json_schema, use "
            "RulerConfig(structured_output=False)"
        )
    elif error.status_code == 400 and config.mode == "probs":
        hint += "; probs mode needs an endpoint that returns `top_logprobs`"
    elif error.status_code in (401, 403):
        hint += f"; check the API key in ${judge.api_key_env}"
    elif error.status_code == 404:
        hint += "; check the judge's model name and base_url"
    return hint
