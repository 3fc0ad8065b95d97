"""Temporal Clue style logic puzzles with a partial-credit reward, trained with GRPO.

    .venv/bin/python examples/temporal_clue/train.py                  # CPU budget, minutes
    .venv/bin/python examples/temporal_clue/train.py --steps 200 --size 4 --group-size 16 \\
        --tasks-per-step 8 --max-tokens 1024 --base-model /models/Qwen3-4B   # a GPU budget

Each puzzle (generated and checked by the solver in `puzzles.py`) asks who took an item,
where and when, from clues about where the suspects were during the evening. The policy
answers through its OpenAI-compatible endpoint inside a `model.rollout(...)` scope, in
three lines (`Who:`, `Where:`, `When:`); the reward is the fraction of fields right, so
a guess that gets one field right still scores 1/3 and groups of attempts differ.
Success means all three right. One worked puzzle in the prompt shows the format; a
larger model may reason before answering (raise `--max-tokens`): only the three labelled
lines are read. Held-out puzzles come from seeds that training never sees.
"""

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gallery import loop
from temporal_clue.puzzles import Puzzle, make_puzzle, parse_answer, score

SYSTEM = (
    "You solve logic puzzles. Use every clue to rule suspects, rooms and times out. "
    "End with three lines: Who: <suspect>, Where: <room>, When: <time>."
)


def _answer(puzzle: Puzzle) -> str:
    who, where, when = puzzle.solution
    return f"Who: {who}\nWhere: {where}\nWhen: {when}"


def _example(size: int) -> list[dict]:
    worked = make_puzzle(-1, size)  # negative seeds are never training or held-out puzzles
    return [
        {"role": "user", "content": worked.text()},
        {"role": "assistant", "content": _answer(worked)},
    ]


def make_attempt(size: int, max_tokens: int):
    example = _example(size)

    async def attempt(model, client, puzzle: Puzzle):
        async with model.rollout(seed=puzzle.seed) as rollout:
            reply = await client.chat.completions.create(
                model=model.served_name,
                max_tokens=max_tokens,
                temperature=1.0,
                messages=[
                    {"role": "system", "content": SYSTEM},
                    *example,
                    {"role": "user", "content": puzzle.text()},
                ],
            )
            answer = parse_answer(reply.choices[0].message.content, puzzle)
            rollout.reward = score(answer, puzzle)
            rollout.metrics["success"] = float(rollout.reward == 1.0)
            rollout.metrics["answered_fields"] = float(sum(v is not None for v in answer.values()))
            rollout.log(f"answer {answer}, solution {puzzle.solution}")
        return rollout.trajectory

    return attempt


def main() -> None:
    parser = loop.parser(
        __doc__.splitlines()[0],
        steps=6,
        tasks_per_step=3,
        group_size=6,
        eval_tasks=24,
        eval_samples=2,
    )
    parser.add_argument("--size", type=int, default=3, help="suspects, rooms and times each")
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args()
    start = args.seed * 1000
    asyncio.run(
        loop.run(
            args,
            name="temporal-clue",
            title=f"Temporal Clue puzzles, size {args.size} (GRPO)",
            attempt=make_attempt(args.size, args.max_tokens),
            training=[make_puzzle(s, args.size) for s in range(start, start + 300)],
            held_out=[make_puzzle(s, args.size) for s in range(100_000, 100_000 + args.eval_tasks)],
        )
    )


if __name__ == "__main__":
    main()
