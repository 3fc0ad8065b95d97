"""Train the bundled model on the demo's add-tool task with RULER rewards only.

    .venv/bin/python examples/ruler_calculator.py --steps 8
    .venv/bin/python examples/ruler_calculator.py --steps 1 --engine transformers  # no vLLM

There is no reward function here: every group of attempts is scored by a RULER judge —
the bundled base model itself, behind the same policy endpoint, in `probs` mode (the
mode for judges too small to write reliable JSON) — that compares the attempts against
the task's rubric. The task's verifiable check (`metrics["success"]`) only measures
held-out success before and after training; it never reaches the trainer. Swap the judge
for a stronger one with `--judge-url https://host/v1 --judge-model NAME --judge-key-env
VAR --mode json`. `--random-rewards` runs the same loop with uniform random rewards,
the control that tells learning from the judge apart from what GRPO does with noise.
"""

import argparse
import asyncio
import random

from rlcoach import BUNDLED_MODEL, LocalBackend, Model, TrainableModel, gather_trajectory_groups
from rlcoach.demo.run import evaluate
from rlcoach.demo.task import RUBRIC, run_question, split_questions
from rlcoach.ruler import after_each, judge_usage
from rlcoach.trajectory.dataset import iterate_dataset


def random_rewards(seed: int):
    """The control: uniform random rewards in place of the judge's, same loop otherwise."""
    rng = random.Random(seed)

    async def hook(group):
        scored = group.model_copy(deep=True)
        for trajectory in scored.trajectories:
            trajectory.reward = rng.random()
        return scored

    return hook


async def main(args: argparse.Namespace) -> None:
    model = TrainableModel("ruler-calculator", "examples", config={"learning_rate": 1e-3})
    held_out, training = split_questions(args.eval_questions, 500, seed=0)
    async with LocalBackend(args.root, engine={"kind": args.engine}) as backend:
        await model.register(backend)
        client = model.openai_client()
        if args.judge_url:
            judge = Model(args.judge_model, base_url=args.judge_url, api_key_env=args.judge_key_env)
        else:  # the base weights (no adapter), so the judge does not drift with the policy
            judge = Model(BUNDLED_MODEL, base_url=model.api_base)
        hook = after_each(judge, rubric=RUBRIC, config={"mode": args.mode, "cache_dir": None})
        if args.random_rewards:
            hook = random_rewards(args.seed)
        before = await evaluate(model, client, held_out, samples=2)
        print(f"held-out success before training: {before:.3f}")
        for batch in iterate_dataset(
            training, batch_size=args.questions, seed=0, initial_step=model.step
        ):
            if batch.step >= args.steps:
                break
            groups = await gather_trajectory_groups(
                (
                    [run_question(model, client, q) for _ in range(args.group_size)]
                    for q in batch.items
                ),
                after_each=hook,
            )
            trajectories = [t for g in groups for t in g.trajectories]
            judged = sum(t.reward for t in trajectories) / len(trajectories)
            success = sum(t.metrics["success"] for t in trajectories) / len(trajectories)
            usage = judge_usage(groups)
            result = await model.train(groups)
            print(
                f"step {batch.step + 1}: judge reward {judged:.3f}  success {success:.3f}  "
                f"judge calls {usage.get('ruler_calls', 0):.0f} tokens "
                f"{usage.get('ruler_prompt_tokens', 0):.0f}+"
                f"{usage.get('ruler_completion_tokens', 0):.0f}  failed groups "
                f"{usage['ruler_failed_groups']:.0f}  "
                f"{'trained' if result.stats.trained else 'skipped'}  "
                f"serving {model.served_name}"
            )
        after = await evaluate(model, client, held_out, samples=2)
        print(f"held-out success after training: {after:.3f}")
        print(f"result: success_before={before:.3f} success_after={after:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--questions", type=int, default=2, help="questions per step")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--eval-questions", type=int, default=48)
    parser.add_argument("--mode", default="probs", choices=["probs", "json"])
    parser.add_argument("--engine", default="vllm", choices=["vllm", "transformers"])
    parser.add_argument("--root", default=".rlcoach")
    parser.add_argument("--judge-url", default=None)
    parser.add_argument("--judge-model", default=BUNDLED_MODEL)
    parser.add_argument("--judge-key-env", default=None)
    parser.add_argument(
        "--random-rewards",
        action="store_true",
        help="control run: uniform random rewards instead of the judge's",
    )
    parser.add_argument("--seed", type=int, default=0)
    asyncio.run(main(parser.parse_args()))
