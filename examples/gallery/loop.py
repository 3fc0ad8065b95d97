"""The loop every gallery example shares: evaluate, train with GRPO, evaluate, plot.

The gallery examples (`email_search/`, `game_2048/`, `tictactoe/`, `temporal_clue/`)
differ in their environment and their rollout; what happens around the rollout is the
same, and it lives here so each example's `train.py` reads as the task alone:

1. serve the policy (`TrainableModel` on a `LocalBackend`, the bundled SmolLM2-135M
   unless `--base-model` names another) and measure it on held-out instances — mean
   reward and success rate, sampled at temperature 1, several samples per instance;
2. `--steps` GRPO steps: `--tasks-per-step` training instances, `--group-size` attempts
   at each (GRPO compares attempts at the same instance), one LoRA step, the new adapter
   served at once; steps where every group had equal rewards are reported and skipped;
3. measure the held-out instances again, write `reward_curve.png` and a `gallery` line
   in `metrics.jsonl` in the run folder, and print a `result:` line.

An example that can demonstrate its task (an `expert(instance) -> ChatRecord`, scripted
from the environment) also takes `--warmup-examples N`: before step 2, one SFT step on N
demonstrations of training instances (`model.train_sft`, assistant tokens only, the same
checkpoint numbering as RL), measured on the held-out instances too. RL cannot learn
from a policy that never earns a reward; a warm-up gives it one that sometimes does.

A rollout is any `async (model, client, instance) -> Trajectory` that records its calls
inside `model.rollout(...)` and sets `metrics["success"]` (1.0 or 0.0) on the trajectory.
Each run is a new model (`<name>-<time>`), so a rerun never resumes an earlier one.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from rlcoach import (
    BUNDLED_MODEL,
    LocalBackend,
    PipelineStep,
    TrainableModel,
    gather_trajectory_groups,
    iterate_dataset,
    run_pipeline,
)
from rlcoach.paths import append_jsonl
from rlcoach.trajectory.trajectories import ChatRecord

Attempt = Callable[[TrainableModel, Any, Any], Awaitable[Any]]
"""One rollout: (model, OpenAI client, instance) -> a scored `Trajectory`."""


def parser(
    description: str,
    *,
    steps: int,
    tasks_per_step: int,
    group_size: int,
    eval_tasks: int,
    eval_samples: int = 2,
    learning_rate: float = 1e-3,
    warmup_examples: int | None = None,
) -> argparse.ArgumentParser:
    """The flags every gallery example takes; the defaults are the example's CPU budget.
    `warmup_examples` (examples with an expert only) adds the SFT warm-up's flags."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, default=steps, help="GRPO steps")
    p.add_argument(
        "--tasks-per-step",
        type=int,
        default=tasks_per_step,
        help="training instances per step (one group each)",
    )
    p.add_argument(
        "--group-size", type=int, default=group_size, help="attempts per instance (GRPO's group)"
    )
    p.add_argument(
        "--eval-tasks",
        type=int,
        default=eval_tasks,
        help="held-out instances evaluated before and after training",
    )
    p.add_argument(
        "--eval-samples", type=int, default=eval_samples, help="attempts per held-out instance"
    )
    p.add_argument("--learning-rate", type=float, default=learning_rate)
    p.add_argument(
        "--base-model",
        default=BUNDLED_MODEL,
        help="base model (a local safetensors folder on a GPU box)",
    )
    p.add_argument("--engine", default="vllm", choices=["vllm", "transformers"])
    p.add_argument("--root", default=".rlcoach", help="where runs are written")
    p.add_argument("--seed", type=int, default=0)
    if warmup_examples is not None:
        p.add_argument(
            "--warmup-examples",
            type=int,
            default=warmup_examples,
            help="SFT demonstrations before RL (0: RL alone)",
        )
        p.add_argument("--warmup-epochs", type=int, default=2)
        p.add_argument("--warmup-learning-rate", type=float, default=1e-3)
    return p


async def _evaluate(
    model: TrainableModel, client: Any, attempt: Attempt, instances: Sequence[Any], samples: int
) -> tuple[float, float]:
    """(mean reward, success rate) of the served step; failed rollouts count as 0."""
    groups = await gather_trajectory_groups(
        ([attempt(model, client, x) for _ in range(samples)] for x in instances),
        description=f"eval {model.served_name}",
        max_failure_fraction=0.2,
    )
    trajectories = [t for g in groups for t in g.trajectories]
    count = len(trajectories) + sum(len(g.failures) for g in groups)
    reward = sum(t.reward for t in trajectories) / max(count, 1)
    success = sum(t.metrics.get("success", 0.0) for t in trajectories) / max(count, 1)
    return reward, success


def plot(
    path: Path,
    title: str,
    rewards: list[float],
    successes: list[float],
    before: tuple[float, float],
    after: tuple[float, float],
    warmed: tuple[float, float] | None = None,
) -> Path:
    """The reward curve of the training rollouts, with held-out before/after lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 3.5))
    steps = list(range(1, len(rewards) + 1))
    axes.plot(steps, rewards, marker="o", label="mean reward (training rollouts)")
    axes.plot(steps, successes, marker=".", label="success (training rollouts)")
    axes.axhline(
        before[0], color="grey", linestyle=":", label=f"held-out reward before {before[0]:.2f}"
    )
    if warmed is not None:
        axes.axhline(
            warmed[0],
            color="orange",
            linestyle="-.",
            label=f"held-out reward after the SFT warm-up {warmed[0]:.2f}",
        )
    axes.axhline(
        after[0], color="green", linestyle="--", label=f"held-out reward after {after[0]:.2f}"
    )
    axes.set_xlabel("step")
    axes.set_ylim(0, 1)
    axes.legend(fontsize=7, loc="upper left")
    axes.set_title(title, fontsize=9)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    figure.savefig(temp, format="png", dpi=120)
    plt.close(figure)
    os.replace(temp, path)  # atomic: a reader never sees half a PNG
    return path


async def _warm_up(
    model: TrainableModel,
    args: argparse.Namespace,
    expert: Callable[[Any], ChatRecord],
    training: Sequence[Any],
) -> None:
    """One SFT step on `args.warmup_examples` demonstrations (training instances, cycled)."""
    instances = itertools.islice(itertools.cycle(training), args.warmup_examples)
    records = [expert(x) for x in instances]
    result = await model.train_sft(
        records,
        {
            "epochs": args.warmup_epochs,
            "learning_rate": args.warmup_learning_rate,
            "seed": args.seed,
        },
        progress=True,
    )
    s = result.stats
    print(
        f"SFT warm-up: {s.examples} demonstrations x {args.warmup_epochs} epochs, loss "
        f"{s.loss_first:.3f} -> {s.loss_last:.3f}, {s.seconds:.1f}s, "
        f"serving {model.served_name}",
        flush=True,
    )


async def run(
    args: argparse.Namespace,
    *,
    name: str,
    title: str,
    attempt: Attempt,
    training: Sequence[Any],
    held_out: Sequence[Any],
    expert: Callable[[Any], ChatRecord] | None = None,
) -> dict[str, float]:
    """Evaluate, (warm up,) train `args.steps` steps, evaluate again; returns the numbers."""
    started = time.perf_counter()
    model = TrainableModel(
        f"{name}-{time.strftime('%Y%m%d-%H%M%S')}",
        "examples",
        base_model=args.base_model,
        config={"learning_rate": args.learning_rate, "seed": args.seed},
    )
    held_out = list(held_out)[: args.eval_tasks]
    async with LocalBackend(args.root, engine={"kind": args.engine}) as backend:
        await model.register(backend)
        client = model.openai_client()
        before = await _evaluate(model, client, attempt, held_out, args.eval_samples)
        print(
            f"held-out before training: reward {before[0]:.3f}  success {before[1]:.3f}  "
            f"({len(held_out)} instances x {args.eval_samples})",
            flush=True,
        )
        warmed = None
        if getattr(args, "warmup_examples", 0) > 0:
            assert expert is not None, "--warmup-examples needs the example's expert"
            await _warm_up(model, args, expert, training)
            warmed = await _evaluate(model, client, attempt, held_out, args.eval_samples)
            print(
                f"held-out after the SFT warm-up: reward {warmed[0]:.3f}  success {warmed[1]:.3f}",
                flush=True,
            )
        rewards: list[float] = []
        successes: list[float] = []
        start = model.step  # after a warm-up, RL numbers its steps on from it
        tasks = iterate_dataset(list(training), args.tasks_per_step, epochs=1000, seed=args.seed)
        batches = {start + b.step: b.items for b in itertools.islice(tasks, args.steps)}
        sampled: dict[int, list[Any]] = {}

        async def rollouts(index: int) -> list[Any]:
            sampled[index] = await gather_trajectory_groups(
                (
                    [attempt(model, client, x) for _ in range(args.group_size)]
                    for x in batches[index]
                ),
                description=f"step {index - start + 1}/{args.steps} rollouts",
            )
            return sampled[index]

        def report(step: PipelineStep) -> None:
            groups = sampled.pop(step.index)
            trajectories = [t for g in groups for t in g.trajectories]
            count = max(len(trajectories), 1)
            rewards.append(sum(t.reward for t in trajectories) / count)
            successes.append(sum(t.metrics.get("success", 0.0) for t in trajectories) / count)
            s = step.result.stats if step.result is not None else None
            if s is None:
                done = f"failed: {step.error}"
            elif s.trained:
                done = (
                    f"trained: loss {s.loss:+.4f}  tokens {s.sampled_tokens}/{s.total_tokens}  "
                    f"train {s.seconds:.1f}s"
                )
            else:
                done = "skipped: every group had equal rewards"
            print(
                f"step {step.index - start + 1}: reward {rewards[-1]:.3f}  "
                f"success {successes[-1]:.3f}  failed {sum(len(g.failures) for g in groups)}  "
                f"rollouts {step.rollout_end - step.rollout_start:.1f}s  {done}  "
                f"serving {model.served_name}",
                flush=True,
            )

        await run_pipeline(model, rollouts, start + args.steps, on_step=report)
        after = await _evaluate(model, client, attempt, held_out, args.eval_samples)
        print(f"held-out after training: reward {after[0]:.3f}  success {after[1]:.3f}", flush=True)
        paths = backend.paths(model)
        curve = plot(
            paths.dir / "reward_curve.png", title, rewards, successes, before, after, warmed
        )
        numbers = {"reward_before": before[0], "success_before": before[1]}
        if warmed is not None:
            numbers |= {"reward_warmup": warmed[0], "success_warmup": warmed[1]}
        numbers |= {
            "reward_after": after[0],
            "success_after": after[1],
            "minutes": (time.perf_counter() - started) / 60,
        }
        append_jsonl(paths.metrics, {"event": "gallery", "example": name, **numbers})
    print(f"reward curve: {curve}")
    print("result: " + " ".join(f"{k}={v:.3f}" for k, v in numbers.items()), flush=True)
    return numbers
