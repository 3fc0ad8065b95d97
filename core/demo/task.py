"""The demo task: learn to use an `add` tool, then state the result.

The bundled 135M model, shown two worked examples, calls the tool with the right
arguments on only about one sampled answer in five for new three-digit questions; the
rest answer from memory, skip the call or garble it. The reward is a plain function of
what happened, so the demo measures learning, not a judge:

- 1.0: called `add` with the question's two numbers and then stated their sum;
- 0.5: called `add` correctly but the final answer lacks the sum;
- 0.2: made a parseable tool call with wrong arguments;
- 0.0: no tool call.

Success means reward 1.0.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlcoach.trajectory.trajectories import tool_message

if TYPE_CHECKING:
    from openai import AsyncOpenAI

    from rlcoach.model import TrainableModel
    from rlcoach.trajectory.trajectories import Trajectory

__all__ = [
    "ADD_TOOL",
    "RUBRIC",
    "SYSTEM",
    "Question",
    "make_questions",
    "run_question",
    "score",
    "split_questions",
]

SYSTEM = (
    "You are a calculator assistant. Always use the add tool to add numbers, then state the result."
)

RUBRIC = """\
The user asks for the sum of two numbers and the assistant has an `add` tool.
- Best: the assistant calls `add` with exactly the two numbers of the question, then \
states the sum the tool returned.
- Worse: it calls `add` correctly but its final answer does not state that sum.
- Worse still: it calls `add` with other numbers, or its tool call is malformed.
- Worst: it answers without calling the tool."""
"""A rubric for judging the task without its reward function (RULER's examples)."""

ADD_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers and return their sum.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


def _worked_example(a: int, b: int, call_id: str) -> list[dict[str, Any]]:
    arguments = json.dumps({"a": a, "b": b})
    return [
        {"role": "user", "content": f"What is {a} + {b}?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "add", "arguments": arguments},
                },
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": str(a + b)},
        {"role": "assistant", "content": f"{a} + {b} = {a + b}"},
    ]


EXAMPLES = [*_worked_example(12, 30, "call_0"), *_worked_example(205, 311, "call_1")]


@dataclass(frozen=True, slots=True)
class Question:
    a: int
    b: int

    @property
    def answer(self) -> int:
        return self.a + self.b

    def messages(self) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": SYSTEM},
            *EXAMPLES,
            {"role": "user", "content": f"What is {self.a} + {self.b}?"},
        ]


def make_questions(n: int, seed: int) -> list[Question]:
    """`n` distinct three-digit additions, a pure function of `seed`."""
    rng = random.Random(seed)
    seen: set[tuple[int, int]] = set()
    while len(seen) < n:
        seen.add((rng.randint(100, 999), rng.randint(100, 999)))
    return [Question(a, b) for a, b in sorted(seen, key=lambda p: rng.random())]


def split_questions(
    held_out: int, training: int, seed: int
) -> tuple[list[Question], list[Question]]:
    """(held-out, training) questions; no held-out question appears in training."""
    evaluation = make_questions(held_out, seed=10_000 + seed)
    excluded = {(q.a, q.b) for q in evaluation}
    return evaluation, [q for q in make_questions(training, seed) if (q.a, q.b) not in excluded]


def _call_arguments(tool_call: Any) -> dict[str, Any] | None:
    if tool_call.function.name != "add":
        return None
    try:
        arguments = json.loads(tool_call.function.arguments or "{}")
    except json.JSONDecodeError:
        return None
    return arguments if isinstance(arguments, dict) else None


def score(question: Question, arguments: dict[str, Any] | None, final_text: str | None) -> float:
    """The reward for one attempt (see the module docstring)."""
    if arguments is None:
        return 0.0
    try:
        given = sorted(int(arguments[k]) for k in ("a", "b"))
    except (KeyError, TypeError, ValueError):
        return 0.2
    if given != sorted((question.a, question.b)):
        return 0.2
    if final_text is not None and str(question.answer) in final_text.replace(",", ""):
        return 1.0
    return 0.5


async def run_question(
    model: TrainableModel,
    client: AsyncOpenAI,
    question: Question,
    *,
    temperature: float = 1.0,
    max_tokens: int = 48,
) -> Trajectory:
    """One attempt: ask, run the tool call if there is one, read the final answer."""
    async with model.rollout(a=question.a, b=question.b) as rollout:
        messages = question.messages()
        reply = await client.chat.completions.create(
            model=model.served_name,
            messages=messages,  # type: ignore[arg-type]  # plain dicts: OpenAI's JSON shape
            tools=[ADD_TOOL],  # type: ignore[list-item]
            temperature=temperature,
            max_tokens=max_tokens,
        )
        message = reply.choices[0].message
        arguments, final_text = None, None
        if message.tool_calls:
            call = message.tool_calls[0]
            arguments = _call_arguments(call)
            try:
                result = str(int(arguments["a"]) + int(arguments["b"])) if arguments else None
            except (KeyError, TypeError, ValueError):
                result = None
            messages = [
                *messages,
                message.model_dump(exclude_none=True),
                tool_message(
                    call.id,
                    result if result is not None else "error: expected integers a, b",
                    error=result is None,
                ),
            ]
            follow_up = await client.chat.completions.create(
                model=model.served_name,
                messages=messages,  # type: ignore[arg-type]  # plain dicts: OpenAI's JSON shape
                tools=[ADD_TOOL],  # type: ignore[list-item]
                temperature=temperature,
                max_tokens=max_tokens,
            )
            final_text = follow_up.choices[0].message.content
        rollout.reward = score(question, arguments, final_text)
        rollout.metrics["success"] = float(rollout.reward == 1.0)
        rollout.metrics["tool_call"] = float(arguments is not None)
    return rollout.trajectory
