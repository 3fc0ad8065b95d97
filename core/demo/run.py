"""`rlcoach demo`: a real GRPO run on this machine with the bundled model.

Measures the held-out success rate, trains for a number of steps (rollouts → groups →
LoRA step → publish), measures again, and writes a reward curve. Every run is a new
model (`calculator-<time>`) under `root`, so a rerun never overwrites an earlier one;
`resume=<name>` continues a run that was stopped.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from rlcoach.backend.local import LocalBackend
from rlcoach.backend.pipeline import PipelineStep, run_pipeline
from rlcoach.demo.task import Question, run_question, split_questions
from rlcoach.model import TrainableModel
from rlcoach.paths import append_jsonl
from rlcoach.rollout.gather import gather_trajectory_groups
from rlcoach.trainer.base import StepStats
from rlcoach.trajectory.dataset import iterate_dataset
from rlcoach.trajectory.trajectories import TrajectoryGroup

if TYPE_CHECKING:
    from openai import AsyncOpenAI

__all__ = ["DemoConfig", "DemoResult", "evaluate", "run_demo"]

PROJECT = "demo"


@dataclass(frozen=True, slots=True)
class DemoConfig:
    steps: int = 8
    questions_per_step: int = 2
    group_size: int = 8
    eval_questions: int = 48
    eval_samples: int = 2
    learning_rate: float = 1e-3
    engine: str = "vllm"
    root: Path = Path(".rlcoach")
    seed: int = 0
    resume: str | None = None
    progress: bool = True


@dataclass(frozen=True, slots=True)
class DemoResult:
    model: str
    success_before: float
    success_after: float
    reward_curve: list[float]
    minutes: float
    curve_png: Path | None

    def summary(self) -> str:
        return (
            f"result: success_before={self.success_before:.3f} "
            f"success_after={self.success_after:.3f} minutes={self.minutes:.1f}"
        )


async def evaluate(
    model: TrainableModel,
    client: AsyncOpenAI,
    questions: list[Question],
    samples: int,
    *,
    progress: bool = True,
) -> float:
    """Success rate of the currently served step, sampled at temperature 1."""
    groups = await gather_trajectory_groups(
        ([run_question(model, client, q) for _ in range(samples)] for q in questions),
        description=f"eval {model.served_name}",
        progress=progress,
        max_failure_fraction=0.1,
    )
    outcomes = [t.metrics["success"] for g in groups for t in g.trajectories]
    outcomes += [0.0 for g in groups for _ in g.failures]
    return sum(outcomes) / len(outcomes)


def _plot(
    path: Path, rewards: list[float], successes: list[float], before: float, after: float
) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    figure, axes = plt.subplots(figsize=(6, 3.5))
    steps = list(range(1, len(rewards) + 1))
    axes.plot(steps, rewards, marker="o", label="mean reward (training rollouts)")
    axes.plot(steps, successes, marker=".", label="success (training rollouts)")
    axes.axhline(before, color="grey", linestyle=":", label=f"held-out success before {before:.2f}")
    axes.axhline(after, color="green", linestyle="--", label=f"held-out success after {after:.2f}")
    axes.set_xlabel("step")
    axes.set_ylim(0, 1)
    axes.legend(fontsize=7, loc="upper left")
    axes.set_title("rlcoach demo: GRPO on SmolLM2-135M, add tool")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    figure.savefig(temp, format="png", dpi=120)
    plt.close(figure)
    os.replace(temp, path)
    return path


def _log(line: str) -> None:
    tqdm.write(line)


def _log_step(
    step: PipelineStep, reward: float, success: float, failures: int, model: TrainableModel
) -> None:
    head = (
        f"step {step.index + 1:>3}  reward {reward:.3f}  success {success:.3f}  "
        f"failed {failures}  rollouts {step.rollout_end - step.rollout_start:.1f}s  "
    )
    if step.result is None:
        _log(head + f"failed: {step.error}; still serving {model.served_name}")
        return
    s = step.result.stats
    assert isinstance(s, StepStats)  # an RL step's
    if not s.trained:
        _log(
            head + "skipped: every group had equal rewards (nothing to learn); "
            f"still serving {model.served_name}"
        )
        return
    _log(
        head + f"loss {s.loss:+.4f}  tokens {s.sampled_tokens}/{s.total_tokens}  "
        f"train {s.seconds:.1f}s  publish {step.result.publish_seconds * 1000:.0f}ms  "
        f"serving {model.served_name}"
    )


async def run_demo(config: DemoConfig) -> DemoResult:
    started = time.perf_counter()
    name = config.resume or f"calculator-{time.strftime('%Y%m%d-%H%M%S')}"
    model = TrainableModel(
        name, PROJECT, config={"learning_rate": config.learning_rate, "seed": config.seed}
    )
    held_out, training = split_questions(config.eval_questions, 500, config.seed)
    backend = LocalBackend(config.root, engine={"kind": config.engine})
    _log(f"starting the {config.engine} engine with the bundled model (first run converts it)")
    async with backend:
        await model.register(backend)
        paths = backend.paths(model)
        _log(f"serving {model.served_name} at {backend.url}/v1; run folder {paths.dir}")
        client = model.openai_client()
        before = await evaluate(
            model, client, held_out, config.eval_samples, progress=config.progress
        )
        _log(f"held-out success before training: {before:.3f}")
        rewards: list[float] = []
        successes: list[float] = []
        batches: dict[int, list[Question]] = {}
        for batch in iterate_dataset(
            training,
            config.questions_per_step,
            epochs=100,
            seed=config.seed,
            initial_step=model.step,
        ):
            if batch.step >= config.steps:
                break
            batches[batch.step] = batch.items
        sampled: dict[int, list[TrajectoryGroup]] = {}

        async def rollouts(index: int) -> list[TrajectoryGroup]:
            sampled[index] = await gather_trajectory_groups(
                (
                    [run_question(model, client, q) for _ in range(config.group_size)]
                    for q in batches[index]
                ),
                description=f"step {index + 1}/{config.steps} rollouts",
                progress=config.progress,
            )
            return sampled[index]

        def report(step: PipelineStep) -> None:
            groups = sampled.pop(step.index)
            trajectories = [t for g in groups for t in g.trajectories]
            reward = sum(t.reward for t in trajectories) / max(len(trajectories), 1)
            success = sum(t.metrics["success"] for t in trajectories) / max(len(trajectories), 1)
            rewards.append(reward)
            successes.append(success)
            _log_step(step, reward, success, sum(len(g.failures) for g in groups), model)

        await run_pipeline(model, rollouts, config.steps, on_step=report)
        after = await evaluate(
            model, client, held_out, config.eval_samples, progress=config.progress
        )
        _log(f"held-out success after training: {after:.3f}")
        curve = _plot(paths.dir / "reward_curve.png", rewards, successes, before, after)
        minutes = (time.perf_counter() - started) / 60
        summary: dict[str, Any] = {
            "event": "demo",
            "success_before": before,
            "success_after": after,
            "minutes": minutes,
        }
        append_jsonl(paths.metrics, summary)
    if curve is not None:
        _log(f"reward curve: {curve}")
    return DemoResult(name, before, after, rewards, minutes, curve)
