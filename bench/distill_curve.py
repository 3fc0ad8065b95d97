"""On-policy distillation against RL from the reward alone, on the demo's task (CPU).

Teacher: the bundled model after `rlcoach demo`'s training (its LoRA adapter, served by
the same engine as `name@step`). Student: the bundled base model. Both arms start from
the base, sample the same number of rollouts per step (the demo's 2 questions x 8) with
the same seed and learning rate, and are scored on the same held-out questions after
every step:

- `rl`: GRPO on the task reward (the demo's own training).
- `distill`: the teacher scores every sampled token and the advantage is the per-token
  reverse KL, `teacher - student` log-prob (`reward_coef=0`: no task reward at all).

Each arm is one process (one engine start), so each fits a 10-minute slot on a 2-core
CPU; `--report` prints both curves, the teacher's level and the steps each arm needed
to reach it (or the best it reached):

    rlcoach demo --steps 4 --eval-questions 16 --eval-samples 1 --root /tmp/od/runs
    python bench/distill_curve.py --arm distill --root /tmp/od/runs --teacher calculator-<time>
    python bench/distill_curve.py --arm rl --root /tmp/od/runs --teacher calculator-<time>
    python bench/distill_curve.py --report --root /tmp/od/runs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from rlcoach import (
    LocalBackend,
    Teacher,
    TrainableModel,
    Validation,
    gather_trajectory_groups,
    run_pipeline,
)
from rlcoach.demo.run import PROJECT, evaluate
from rlcoach.demo.task import run_question, split_questions
from rlcoach.trajectory.dataset import iterate_dataset


async def run_arm(args: argparse.Namespace) -> dict:
    held_out, training = split_questions(args.eval_questions, 500, args.seed)
    name = f"{args.arm}-{time.strftime('%H%M%S')}"
    config: dict = {"learning_rate": args.learning_rate, "seed": args.seed}
    if args.arm == "distill":
        config["reward_coef"] = 0.0
    student = TrainableModel(name, PROJECT, config=config)
    backend = LocalBackend(args.root, engine={"kind": "vllm"})
    async with backend:
        # The demo's run, registered so its latest checkpoint is served as `name@step`.
        demo = TrainableModel(args.teacher, PROJECT)
        await demo.register(backend)
        await student.register(backend)
        client = student.openai_client()
        teacher_level = None
        if args.arm == "distill":
            teacher_level = await evaluate(
                demo, demo.openai_client(), held_out, args.eval_samples, progress=False
            )
            print(f"teacher {demo.served_name}: held-out {teacher_level:.3f}", flush=True)
        batches = {
            b.step: b.items
            for b in iterate_dataset(training, 2, epochs=100, seed=args.seed)
            if b.step < args.steps
        }
        started = time.perf_counter()

        async def rollouts(index: int):
            return await gather_trajectory_groups(
                ([run_question(student, client, q) for _ in range(8)] for q in batches[index]),
                progress=False,
            )

        async def held_out_success() -> float:
            return await evaluate(student, client, held_out, args.eval_samples, progress=False)

        def report(step) -> None:
            s = step.result.stats if step.result is not None else None
            print(
                f"{args.arm} step {step.index + 1}: held-out {step.validation}  "
                f"trained {getattr(s, 'trained', None)}  tokens {getattr(s, 'sampled_tokens', 0)}"
                f"  train {step.train_end - step.train_start:.1f}s",
                flush=True,
            )

        teacher = Teacher(demo.served_name) if args.arm == "distill" else None
        run = await run_pipeline(
            student,
            rollouts,
            args.steps,
            on_step=report,
            validation=Validation(held_out_success, keep_best=False),
            teacher=teacher,
        )
    result = {
        "arm": args.arm,
        "teacher": demo.served_name,
        "teacher_level": teacher_level,
        "curve": [run.baseline, *(s.validation for s in run)],
        "rollouts_per_step": 16,
        "eval": f"{args.eval_questions} questions x {args.eval_samples}",
        "minutes": (time.perf_counter() - started) / 60,
    }
    (Path(args.root) / f"distill_curve-{args.arm}.json").write_text(json.dumps(result))
    return result


def steps_to(curve: list[float | None], level: float) -> int | None:
    return next((i for i, v in enumerate(curve) if v is not None and v >= level), None)


def report(root: Path) -> None:
    arms = {
        a: json.loads((root / f"distill_curve-{a}.json").read_text()) for a in ("distill", "rl")
    }
    level = arms["distill"]["teacher_level"]
    print(f"teacher {arms['distill']['teacher']}: held-out success {level:.3f}")
    for arm, data in arms.items():
        curve = " ".join(f"{v:.3f}" for v in data["curve"])
        print(f"{arm:>8}: held-out success by step (0 = base): {curve}")
    reach = {arm: steps_to(data["curve"], 0.9 * level) for arm, data in arms.items()}
    print(f"steps to 90% of the teacher's level: {reach}")
    if reach["distill"] and reach["rl"]:
        print(f"ratio rl/distill: {reach['rl'] / reach['distill']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm", choices=["distill", "rl"])
    parser.add_argument("--report", action="store_true")
    parser.add_argument("--root", type=Path, required=True, help="the demo run's root")
    parser.add_argument("--teacher", default="", help="the demo run's model name")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--eval-questions", type=int, default=16)
    parser.add_argument("--eval-samples", type=int, default=2)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.report:
        report(args.root)
    else:
        print(json.dumps(asyncio.run(run_arm(args))))


if __name__ == "__main__":
    main()
