"""Tic Tac Toe against a scripted opponent, trained with GRPO.

    .venv/bin/python examples/tictactoe/train.py                      # CPU budget, minutes
    .venv/bin/python examples/tictactoe/train.py --steps 100 --group-size 16 \\
        --tasks-per-step 8 --opponent blocking --base-model /models/Qwen3-4B   # a GPU budget

Each game is one multi-turn conversation with the policy through its OpenAI-compatible
endpoint (`model.openai_client()`), inside a `model.rollout(...)` scope, so the exact
sampled tokens of every move are recorded: the policy sees the board, answers a cell
number, sees the opponent's reply and the new board, and so on until the game ends. The
rules, the opponent and the reward (win 1.0, draw 0.6, loss 0.3, partial credit for legal
moves before an illegal one) are in `env.py`. A short worked game in the prompt shows the
bundled 135M model the answer format; without it almost every first reply is prose.
Held-out games use opponent seeds that training never sees.
"""

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gallery import loop
from tictactoe.env import Board, Game, Match, games, parse_move

SYSTEM = (
    "You play Tic Tac Toe as X against O. The cells are numbered 1 to 9 and a free "
    "cell shows its number. Three X in a row win. Answer with the number of one free "
    "cell and nothing else."
)


def _board(text: str) -> str:
    return f"{text}\nBoard:\n" if text else "Board:\n"


def _example() -> list[dict]:
    """A worked opening: two moves in the expected format."""
    board = Board()
    first = f"New game. {_board('')}{board.render()}\nYour move."
    board.play(5, "X")
    board.play(1, "O")
    second = f"{_board('O played 1.')}{board.render()}\nYour move."
    return [
        {"role": "user", "content": first},
        {"role": "assistant", "content": "5"},
        {"role": "user", "content": second},
        {"role": "assistant", "content": "9"},
    ]


EXAMPLE = _example()


def make_attempt(opponent: str, max_tokens: int):
    async def attempt(model, client, game: Game):
        match = Match(game, opponent)
        async with model.rollout(game=game.seed, policy_first=game.policy_first) as rollout:
            note = f"O played {match.last_opponent}." if match.last_opponent else ""
            first = f"New game. {_board(note)}{match.board.render()}\nYour move."
            messages = [
                {"role": "system", "content": SYSTEM},
                *EXAMPLE,
                {"role": "user", "content": first},
            ]
            while match.outcome is None:
                reply = await client.chat.completions.create(
                    model=model.served_name,
                    messages=messages,
                    max_tokens=max_tokens,
                    temperature=1.0,
                )
                text = reply.choices[0].message.content or ""
                match.move(parse_move(text))
                messages.append({"role": "assistant", "content": text})
                if match.outcome is None:
                    messages.append(
                        {
                            "role": "user",
                            "content": f"{_board(f'O played {match.last_opponent}.')}"
                            f"{match.board.render()}\nYour move.",
                        }
                    )
            rollout.reward = match.reward
            rollout.metrics["success"] = float(match.outcome == "win")
            rollout.metrics["legal_moves"] = float(match.legal_moves)
            rollout.metrics["finished"] = float(match.outcome != "illegal")
            rollout.log(f"outcome {match.outcome}")
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
    parser.add_argument("--opponent", default="random", choices=["random", "blocking"])
    parser.add_argument("--max-tokens", type=int, default=6, help="tokens per move")
    args = parser.parse_args()
    asyncio.run(
        loop.run(
            args,
            name="tictactoe",
            title=f"Tic Tac Toe vs a {args.opponent} opponent (GRPO)",
            attempt=make_attempt(args.opponent, args.max_tokens),
            training=games(500, start=args.seed * 1000),
            held_out=games(args.eval_tasks, start=100_000 + args.seed * 1000),
        )
    )


if __name__ == "__main__":
    main()
