"""2048 with a programmatic environment, trained with GRPO.

    .venv/bin/python examples/game_2048/train.py                      # CPU budget, minutes
    .venv/bin/python examples/game_2048/train.py --steps 100 --moves 40 --group-size 16 \\
        --tasks-per-step 8 --base-model /models/Qwen3-4B              # a GPU budget

Each episode is one multi-turn conversation through the policy's OpenAI-compatible
endpoint inside a `model.rollout(...)` scope (exact tokens recorded): the policy sees the
board and the moves that would change it, answers a direction, and sees the next board
after the move and a new tile. An episode is `--moves` turns from a mid-game start board
(a whole game is hundreds of moves: beyond a CPU budget). The rules, the seeded spawns,
the greedy yardstick and the partial-credit reward are in `env.py`; success means
scoring at least what the greedy player scores on the same instance.
"""

import asyncio
import sys
from functools import cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gallery import loop
from game_2048.env import Episode, Start, greedy_score, legal_moves, parse_direction, render, reward

SYSTEM = (
    "You play 2048. All tiles slide in the direction you choose, and two equal "
    "tiles that meet merge into one tile of their sum. Merge as many tiles as you can. "
    "Answer with one word: left, right, up or down."
)


def _turn(grid) -> str:
    options = ", ".join(legal_moves(grid))
    return f"Board:\n{render(grid)}\nMoves that change the board: {options}.\nYour move?"


EXAMPLE_BOARD = ((2, 2, 0, 0), (0, 4, 0, 0), (0, 0, 0, 0), (0, 0, 0, 2))
EXAMPLE = [
    {"role": "user", "content": _turn(EXAMPLE_BOARD)},
    {"role": "assistant", "content": "left"},
]


def make_attempt(moves: int, max_tokens: int):
    @cache
    def yardstick(start: Start) -> int:
        return greedy_score(start, moves)

    async def attempt(model, client, start: Start):
        episode = Episode(start)
        async with model.rollout(seed=start.seed) as rollout:
            messages = [
                {"role": "system", "content": SYSTEM},
                *EXAMPLE,
                {"role": "user", "content": _turn(episode.grid)},
            ]
            for turn in range(moves):
                reply = await client.chat.completions.create(
                    model=model.served_name,
                    messages=messages,
                    max_tokens=max_tokens,
                    temperature=1.0,
                )
                text = reply.choices[0].message.content or ""
                direction = parse_direction(text)
                episode.play(direction)
                messages.append({"role": "assistant", "content": text})
                if direction is None or not legal_moves(episode.grid) or turn == moves - 1:
                    break  # unreadable reply, game over, or the horizon
                messages.append({"role": "user", "content": _turn(episode.grid)})
            greedy = yardstick(start)
            rollout.reward = reward(episode.valid, episode.score, greedy, moves)
            rollout.metrics["success"] = float(episode.valid > 0 and episode.score >= greedy)
            rollout.metrics["score"] = float(episode.score)
            rollout.metrics["valid_moves"] = float(episode.valid)
            rollout.log(f"score {episode.score} vs greedy {greedy}, max tile {episode.max_tile}")
        return rollout.trajectory

    return attempt


def main() -> None:
    parser = loop.parser(
        __doc__.splitlines()[0],
        steps=6,
        tasks_per_step=3,
        group_size=4,
        eval_tasks=16,
        eval_samples=2,
    )
    parser.add_argument("--moves", type=int, default=4, help="turns per episode")
    parser.add_argument("--max-tokens", type=int, default=4, help="tokens per move")
    args = parser.parse_args()
    asyncio.run(
        loop.run(
            args,
            name="game-2048",
            title=f"2048, {args.moves} moves from mid-game (GRPO)",
            attempt=make_attempt(args.moves, args.max_tokens),
            training=[Start(s) for s in range(args.seed * 1000, args.seed * 1000 + 500)],
            held_out=[Start(s) for s in range(100_000, 100_000 + args.eval_tasks)],
        )
    )


if __name__ == "__main__":
    main()
