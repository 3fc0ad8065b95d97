"""SFT warm-up, then RL: the same GRPO run from the base model and from a warmed-up one.

The task is the demo's `add` tool (rlcoach.demo.task) *without* the worked examples in
the prompt: the bundled 135M model, given only the instruction and the tool, almost never
makes a valid call, so GRPO's groups have no reward variance and RL alone has nothing to
learn from. A few scripted expert conversations (call `add`, read the result, state the
sum) fine-tuned in first (`train_sft`, assistant tokens only) give the policy a non-zero
success rate, and the same RL budget then has signal to work with.

    .venv/bin/python examples/sft_warmup/train.py            # CPU defaults, a few minutes

Both arms run on one engine (two LoRAs), are evaluated on the same held-out questions at
temperature 1, and the script writes `sft_warmup.png` and prints one `result:` line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

from rlcoach import LocalBackend, TrainableModel, gather_trajectory_groups
from rlcoach.demo.task import ADD_TOOL, SYSTEM, Question, score, split_questions
from rlcoach.trajectory.trajectories import ChatRecord, Trajectory, tool_message


def prompt(question: Question) -> list[dict]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"What is {question.a} + {question.b}?"},
    ]


def expert(question: Question, index: int) -> ChatRecord:
    """A scripted demonstration: the call, the tool's answer, the stated sum."""
    call_id = f"call_{index}"
    return ChatRecord(
        messages=[
            *prompt(question),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": "add",
                            "arguments": json.dumps({"a": question.a, "b": question.b}),
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": str(question.answer)},
            {"role": "assistant", "content": f"{question.a} + {question.b} = {question.answer}"},
        ],
        tools=[ADD_TOOL],
    )


async def attempt(model: TrainableModel, question: Question) -> Trajectory:
    client = model.openai_client()
    async with model.rollout(a=question.a, b=question.b) as rollout:
        messages = prompt(question)
        reply = await client.chat.completions.create(
            model=model.served_name, messages=messages, tools=[ADD_TOOL], max_tokens=48
        )
        message = reply.choices[0].message
        arguments, final_text = None, None
        if message.tool_calls and message.tool_calls[0].function.name == "add":
            call = message.tool_calls[0]
            try:
                arguments = json.loads(call.function.arguments or "{}")
                result = str(int(arguments["a"]) + int(arguments["b"]))
            except (ValueError, TypeError, KeyError):
                arguments = arguments if isinstance(arguments, dict) else {}
                result = None
            messages += [
                message.model_dump(exclude_none=True),
                tool_message(
                    call.id,
                    result if result is not None else "error: expected integers a and b",
                    error=result is None,
                ),
            ]
            follow_up = await client.chat.completions.create(
                model=model.served_name, messages=messages, tools=[ADD_TOOL], max_tokens=48
            )
            final_text = follow_up.choices[0].message.content
        rollout.reward = score(question, arguments, final_text)
        rollout.metrics["success"] = float(rollout.reward == 1.0)
    return rollout.trajectory


async def success_rate(model: TrainableModel, questions: list[Question], samples: int) -> float:
    groups = await gather_trajectory_groups(
        ([attempt(model, q) for _ in range(samples)] for q in questions),
        description=f"eval {model.served_name}",
        max_failure_fraction=0.2,
    )
    outcomes = [t.metrics["success"] for g in groups for t in g.trajectories]
    outcomes += [0.0 for g in groups for _ in g.failures]
    return sum(outcomes) / len(outcomes)


async def rl(
    model: TrainableModel, questions: list[Question], args: argparse.Namespace, label: str
) -> list[float]:
    rewards = []
    for step in range(args.steps):
        batch = [
            questions[(step * args.questions_per_step + i) % len(questions)]
            for i in range(args.questions_per_step)
        ]
        groups = await gather_trajectory_groups(
            ([attempt(model, q) for _ in range(args.group_size)] for q in batch),
            description=f"{label} step {step + 1}",
        )
        trajectories = [t for g in groups for t in g.trajectories]
        reward = sum(t.reward for t in trajectories) / max(len(trajectories), 1)
        result = await model.train(groups)
        rewards.append(reward)
        state = f"serving {model.served_name}" if result.stats.trained else "skipped: no variance"
        print(f"{label} step {step + 1}: reward {reward:.3f}  {state}", flush=True)
    return rewards


def plot(path: Path, curves: dict[str, list[float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 3.5))
    for label, rewards in curves.items():
        axes.plot(range(1, len(rewards) + 1), rewards, marker="o", label=label)
    axes.set_xlabel("RL step")
    axes.set_ylabel("mean reward")
    axes.set_ylim(0, 1)
    axes.legend(fontsize=8)
    axes.set_title("add tool without worked examples: RL alone vs SFT warm-up + RL")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)  # with a RemoteBackend, a new local folder
    temp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    figure.savefig(temp, format="png", dpi=120)
    plt.close(figure)
    os.replace(temp, path)


async def main(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    held_out, training = split_questions(args.eval_questions, 400, args.seed)
    demonstrations = [expert(q, i) for i, q in enumerate(training[: args.demonstrations])]
    rl_questions = training[args.demonstrations :]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    config = {"learning_rate": args.learning_rate, "seed": args.seed}
    rl_only = TrainableModel(f"rl-only-{stamp}", "sft-warmup", args.base_model, config)
    warmed = TrainableModel(f"sft-rl-{stamp}", "sft-warmup", args.base_model, config)
    async with LocalBackend(args.root, engine={"kind": args.engine}) as backend:
        await rl_only.register(backend)
        await warmed.register(backend)
        base = await success_rate(rl_only, held_out, args.eval_samples)
        print(f"held-out success, base model: {base:.3f}", flush=True)
        rl_curve = await rl(rl_only, rl_questions, args, "RL only")
        after_rl = await success_rate(rl_only, held_out, args.eval_samples)
        print(f"held-out success, RL only: {after_rl:.3f}", flush=True)

        sft = await warmed.train_sft(
            demonstrations, {"epochs": args.sft_epochs, "learning_rate": args.sft_learning_rate}
        )
        s = sft.stats
        print(
            f"SFT warm-up: {s.examples} demonstrations, loss {s.loss_first:.3f} -> "
            f"{s.loss_last:.3f}, serving {warmed.served_name}",
            flush=True,
        )
        after_sft = await success_rate(warmed, held_out, args.eval_samples)
        print(f"held-out success, after SFT: {after_sft:.3f}", flush=True)
        sft_curve = await rl(warmed, rl_questions, args, "SFT + RL")
        after_both = await success_rate(warmed, held_out, args.eval_samples)
        print(f"held-out success, SFT + RL: {after_both:.3f}", flush=True)
        figure = backend.paths(warmed).dir.parent / "sft_warmup.png"
        plot(figure, {"RL only": rl_curve, "SFT warm-up + RL": sft_curve})
    print(f"reward curves: {figure}")
    print(
        f"result: base={base:.3f} rl_only={after_rl:.3f} sft={after_sft:.3f} "
        f"sft_rl={after_both:.3f} minutes={(time.perf_counter() - started) / 60:.1f}"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="RL steps per arm")
    parser.add_argument("--questions-per-step", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--demonstrations", type=int, default=32)
    parser.add_argument("--sft-epochs", type=int, default=3)
    parser.add_argument("--sft-learning-rate", type=float, default=1e-3)
    parser.add_argument("--learning-rate", type=float, default=1e-3, help="RL learning rate")
    parser.add_argument("--eval-questions", type=int, default=24)
    parser.add_argument("--eval-samples", type=int, default=2)
    parser.add_argument("--base-model", default="smollm2-135m-instruct")
    parser.add_argument("--engine", default="vllm", choices=["vllm", "transformers"])
    parser.add_argument("--root", type=Path, default=Path(".rlcoach"))
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
