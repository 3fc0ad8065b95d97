"""The smallest rlcoach loop: rollouts through an OpenAI client, a reward, GRPO steps.

    .venv/bin/python examples/basic_loop.py --steps 10
    .venv/bin/python examples/basic_loop.py --steps 1 --engine transformers  # no vLLM

The reward prefers short answers that contain the number 4; the bundled model learns it
within a few steps.
"""

import argparse
import asyncio

from rlcoach import LocalBackend, TrainableModel, gather_trajectory_groups

QUESTION = [{"role": "user", "content": "What is 2 + 2? Answer briefly."}]


async def attempt(model, client):
    async with model.rollout(question="2+2") as rollout:
        reply = await client.chat.completions.create(
            model=model.served_name, messages=QUESTION, max_tokens=24, temperature=1.0
        )
        text = reply.choices[0].message.content or ""
        rollout.reward = float("4" in text) - len(text) / 200
    return rollout.trajectory


async def main(steps: int, engine: str, root: str) -> None:
    model = TrainableModel("basic", "examples", config={"learning_rate": 1e-3})
    async with LocalBackend(root, engine={"kind": engine}) as backend:
        await model.register(backend)
        client = model.openai_client()
        for _ in range(steps):
            groups = await gather_trajectory_groups(
                [attempt(model, client) for _ in range(4)] for _ in range(2)
            )
            result = await model.train(groups)
            rewards = [r for g in groups for r in g.rewards]
            print(
                f"step {result.step}: mean reward {sum(rewards) / len(rewards):.3f}, "
                f"loss {result.stats.loss:+.4f}, now serving {model.served_name}"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--engine", default="vllm", choices=["vllm", "transformers"])
    parser.add_argument("--root", default=".rlcoach")
    args = parser.parse_args()
    asyncio.run(main(args.steps, args.engine, args.root))
