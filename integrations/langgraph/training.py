"""Training a LangGraph app end to end: train and held-out splits, an optional SFT
warm-up, GRPO through core's `run_pipeline` with held-out validation, and the report.

    @rollout_fn(policy)
    async def attempt(scope, task):                 # the user's graph, run on one task
        state = await graph.ainvoke({"messages": [("user", task["question"])]})
        scope.record_state(state)
        scope.reward = score(task, state)

    report = await train_graph(policy, tasks, attempt, GraphTrainConfig(steps=8))
    report.summary()   # 'held-out success 0.188 (base) -> 0.250 (SFT) -> 0.375 (RL)'

The choices, in the order they run:

- **Splits.** `tasks` are split once into train and held out (`eval_fraction`, seeded,
  in input order); `held_out=` gives the held-out tasks instead. No held-out task is
  trained on. The held-out rollouts are logged as the `val` split (`model.log`), so they
  land beside the run's trajectories and in the sinks as `val/reward`.
- **The score** of the served step is (success, reward) over `eval_samples` attempts per
  held-out task: success is the trajectory's `success` metric where the rollout set one,
  else whether its reward reached `success_reward`; a failed rollout counts 0. Success
  decides, reward breaks its ties.
- **SFT warm-up** (`warmup=`, chat records or trajectories of the task done right):
  `model.train_sft` before RL, so GRPO starts from a policy whose groups differ; the
  warm-up's score is the baseline RL must beat.
- **RL** is core's loop (`run_pipeline` + `Validation`): `tasks_per_step` tasks x
  `group_size` attempts a step, validated every `eval_every` steps and after the last;
  it stops after `patience` validations below the best (a tie is no fall), and the best
  checkpoint (the warm-up's or an RL step's) is served at the end (`model.restore`).
- **The report** (`GraphTrainReport`, also `report.json` in the model's run folder):
  base -> SFT -> final held-out numbers, the curve, the steps, what was restored. The
  final number is a fresh evaluation of the served model, not the curve's best point
  (the highest of several noisy ones).
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from rlcoach.backend.pipeline import PipelineStep, Validation, run_pipeline
from rlcoach.errors import ConfigError
from rlcoach.paths import write_text_atomic
from rlcoach.rollout.gather import gather_trajectory_groups
from rlcoach.trajectory.dataset import iterate_dataset
from rlcoach.validation import Config

if TYPE_CHECKING:
    from rlcoach import TrainableModel
    from rlcoach.trajectory.trajectories import ChatRecord, Trajectory, TrajectoryGroup

__all__ = ["GraphTrainConfig", "GraphTrainReport", "HeldOutPoint", "train_graph"]

AttemptFn = Callable[[Any], Awaitable["Trajectory"]]
"""One rollout of the app on a task (a `rollout_fn`-decorated function), scored."""


class GraphTrainConfig(Config):
    """How `train_graph` splits, warms up, trains and validates."""

    steps: int = Field(8, ge=0)
    """RL steps (fewer when validation stops early)."""
    tasks_per_step: int = Field(2, ge=1)
    group_size: int = Field(4, ge=2)
    """Attempts per task in a step: GRPO compares them."""
    eval_fraction: float = Field(0.25, gt=0.0, lt=1.0)
    """The share of `tasks` held out (ignored with `held_out=`)."""
    eval_samples: int = Field(2, ge=1)
    """Attempts per held-out task at each evaluation."""
    eval_every: int = Field(2, ge=1)
    patience: int | None = Field(2, ge=1)
    """Stop RL after this many validations below the best; None: never early."""
    keep_best: bool = True
    success_reward: float = 1.0
    """A rollout without a `success` metric succeeded when its reward reached this."""
    warmup_epochs: int = Field(2, ge=1)
    warmup_learning_rate: float = Field(1e-3, gt=0.0)
    seed: int = 0
    max_concurrency: int | None = Field(8, ge=1)


class HeldOutPoint(BaseModel):
    """One held-out evaluation: the served step, which phase it followed, the numbers."""

    step: int
    label: str
    """`base`, `SFT`, `RL <k>` (k RL checkpoints committed) or `final`."""
    success: float
    reward: float
    rollouts: int
    failed: int


class GraphTrainReport(BaseModel):
    """What `train_graph` did: base -> SFT -> RL on held-out tasks."""

    model: str
    served: str
    """The served name at the end (`name@step`)."""
    train_tasks: int
    held_out_tasks: int
    base: HeldOutPoint
    sft: HeldOutPoint | None
    final: HeldOutPoint
    curve: list[HeldOutPoint]
    """Every evaluation, in order (base, SFT, the RL validations)."""
    best_step: int | None
    restored_from: int | None
    stopped_early: bool
    steps: list[dict[str, Any]]
    """Per RL step: mean reward of its batch, whether it trained, its loss or error."""
    minutes: float

    def summary(self) -> str:
        """`held-out success 0.188 (base) -> 0.250 (SFT) -> 0.375 (RL, ...)`."""
        parts = [f"{self.base.success:.3f} (base)"]
        if self.sft is not None:
            parts.append(f"{self.sft.success:.3f} (SFT)")
        kept = f", step {self.restored_from} kept" if self.restored_from is not None else ""
        early = ", stopped early" if self.stopped_early else ""
        parts.append(f"{self.final.success:.3f} (RL{kept}{early}, serving {self.served})")
        return "held-out success " + " -> ".join(parts)


async def train_graph(
    model: TrainableModel,
    tasks: Sequence[Any],
    attempt: AttemptFn,
    config: GraphTrainConfig | None = None,
    *,
    held_out: Sequence[Any] | None = None,
    warmup: Sequence[ChatRecord | Trajectory] | None = None,
) -> GraphTrainReport:
    """Split, evaluate the base, warm up (with `warmup`), train with validation,
    evaluate what is served; see the module docstring. `model` is registered."""
    config = config or GraphTrainConfig()
    started = time.perf_counter()
    train, evaluation = _split(tasks, held_out, config)
    curve = _Curve(model, evaluation, attempt, config)
    base = await curve.add("base")
    sft = None
    if warmup:
        sft_config = {"epochs": config.warmup_epochs, "learning_rate": config.warmup_learning_rate}
        await model.train_sft(list(warmup), sft_config)
        sft = await curve.add("SFT")
    curve.first_rl = model.step
    validation = Validation(
        curve.score,
        every=config.eval_every,
        patience=config.patience,
        keep_best=config.keep_best,
        plateau_stops=False,  # a few held-out tasks tie often; only a fall counts
    )
    steps: list[dict[str, Any]] = []
    rewards: dict[int, float] = {}
    batches = iterate_dataset(
        train, config.tasks_per_step, epochs=1_000_000, seed=config.seed, initial_step=model.step
    )

    async def batch(index: int) -> list[TrajectoryGroup]:
        drawn = next(batches).items
        groups = await gather_trajectory_groups(
            ([attempt(task) for _ in range(config.group_size)] for task in drawn),
            max_concurrency=config.max_concurrency,
            max_failure_fraction=1.0,
        )
        rewards[index] = _mean([t.reward for g in groups for t in g.trajectories])
        return groups

    def on_step(step: PipelineStep) -> None:
        stats = step.result.stats if step.result is not None else None
        steps.append(
            {
                "index": step.index,
                "reward": rewards.pop(step.index),
                "trained": bool(stats and stats.trained),
                "loss": stats.loss if stats else None,
                "error": step.error,
                "validation": _plain(step.validation),
            }
        )

    run = await run_pipeline(
        model, batch, model.step + config.steps, on_step=on_step, validation=validation
    )
    final = await curve.evaluate("final")
    report = GraphTrainReport(
        model=model.name,
        served=model.served_name,
        train_tasks=len(train),
        held_out_tasks=len(evaluation),
        base=base,
        sft=sft,
        final=final,
        curve=curve.points,
        best_step=run.best_step,
        restored_from=run.restored_from,
        stopped_early=len(run) < config.steps,
        steps=steps,
        minutes=(time.perf_counter() - started) / 60,
    )
    folder = model.backend.paths(model).dir if hasattr(model.backend, "paths") else None
    if folder is not None:
        write_text_atomic(folder / "report.json", report.model_dump_json(indent=2) + "\n")
    return report


def _split(
    tasks: Sequence[Any], held_out: Sequence[Any] | None, config: GraphTrainConfig
) -> tuple[list[Any], list[Any]]:
    """(train, held out): `held_out` as given, else a seeded share of `tasks`."""
    if held_out is not None:
        train, evaluation = list(tasks), list(held_out)
    else:
        order = list(range(len(tasks)))
        random.Random(config.seed).shuffle(order)
        count = round(len(tasks) * config.eval_fraction)
        chosen = set(order[:count])
        train = [t for i, t in enumerate(tasks) if i not in chosen]
        evaluation = [t for i, t in enumerate(tasks) if i in chosen]
    if not train or not evaluation:
        raise ConfigError(
            f"{len(tasks)} tasks gave {len(train)} to train on and {len(evaluation)} held "
            f"out (eval_fraction={config.eval_fraction}); both need at least one: give "
            "more tasks, change eval_fraction, or pass held_out="
        )
    return train, evaluation


class _Curve:
    """The held-out evaluations of the served steps; `score` is the validation's scorer,
    reusing the last evaluation when the step has not changed since (the warm-up's)."""

    def __init__(
        self, model: TrainableModel, tasks: list[Any], attempt: AttemptFn, config: GraphTrainConfig
    ) -> None:
        self.model, self.tasks, self.attempt, self.config = model, tasks, attempt, config
        self.points: list[HeldOutPoint] = []
        self.first_rl = 0

    async def evaluate(self, label: str) -> HeldOutPoint:
        groups = await gather_trajectory_groups(
            ([self.attempt(task) for _ in range(self.config.eval_samples)] for task in self.tasks),
            max_concurrency=self.config.max_concurrency,
            max_failure_fraction=1.0,
        )
        await self.model.log(groups, split="val")
        trajectories = [t for g in groups for t in g.trajectories]
        failed = sum(len(g.failures) for g in groups)
        total = len(trajectories) + failed
        wins = [self._succeeded(t) for t in trajectories]
        return HeldOutPoint(
            step=self.model.step,
            label=label,
            success=sum(wins) / total if total else 0.0,
            reward=sum(t.reward for t in trajectories) / total if total else 0.0,
            rollouts=total,
            failed=failed,
        )

    async def add(self, label: str) -> HeldOutPoint:
        point = await self.evaluate(label)
        self.points.append(point)
        return point

    async def score(self) -> tuple[float, float]:
        if not self.points or self.points[-1].step != self.model.step:
            await self.add(f"RL {self.model.step - self.first_rl}")
        point = self.points[-1]
        return (round(point.success, 6), round(point.reward, 6))

    def _succeeded(self, trajectory: Trajectory) -> float:
        if "success" in trajectory.metrics:
            return float(trajectory.metrics["success"])
        return float(trajectory.reward >= self.config.success_reward)


def _plain(score: Any) -> Any:
    """A score as JSON keeps it: a tuple as a list (so the report reads back equal)."""
    return list(score) if isinstance(score, tuple) else score


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
