"""Training and evaluating a `verifiers` environment: `rlcoach env train` / `env eval`.

    from rlcoach.integrations.verifiers import EnvTrainConfig, train_environment
    run = await train_environment(EnvTrainConfig(env="my_env.py", steps=8))
    run.before.reward, run.after.reward   # held-out mean reward, base and trained

The environment's train dataset gives the scenarios (`rows_per_step` rows a step, each
attempted `group_size` times, through `run_pipeline`, so resuming and failure handling
are the core loop's); its eval split (its dataset when it has none) is the held-out set,
scored before and after training by the environment's own rubric, for the base weights
and the trained adapter. The held-out groups go to the sinks too (`model.log`, split
`val`), so the report and W&B/Langfuse show them beside the training steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field

from rlcoach import (
    BUNDLED_MODEL,
    LocalBackend,
    Model,
    PipelineRun,
    TrainableModel,
    TrajectoryGroup,
    run_pipeline,
)
from rlcoach.integrations.verifiers.environment import load, rows
from rlcoach.integrations.verifiers.rollout import GroupRunner
from rlcoach.models.base_model import served_base_name
from rlcoach.validation import Config

__all__ = ["EnvEvaluation", "EnvRun", "EnvTrainConfig", "evaluate_environment", "train_environment"]


class EnvTrainConfig(Config):
    """What `rlcoach env train` is told (its flags build one)."""

    model_config = ConfigDict(extra="forbid")

    env: str
    """The environment: an installed module's id or a `.py` file / package folder."""
    env_args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for its `load_environment()`."""
    base_model: str = BUNDLED_MODEL
    name: str | None = None
    """The trained model's name (default: the environment's name); an existing one resumes."""
    project: str = "environments"
    steps: int = Field(4, ge=0)
    rows_per_step: int = Field(2, ge=1)
    """Dataset rows per step; each is one group."""
    group_size: int = Field(4, ge=2)
    """Attempts per row (GRPO compares them)."""
    eval_rows: int = Field(8, ge=0)
    """Held-out rows scored before and after training (0: no evaluation)."""
    eval_samples: int = Field(1, ge=1)
    max_tokens: int = Field(128, ge=1)
    """Tokens per policy reply (every turn)."""
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    learning_rate: float = Field(1e-3, gt=0.0)
    engine: Literal["vllm", "transformers"] = "vllm"
    root: Path = Path(".rlcoach")
    seed: int = 0

    @property
    def model_name(self) -> str:
        if self.name:
            return self.name
        stem = Path(self.env).stem if self.env.endswith(".py") else Path(self.env).name
        return stem.replace("_", "-") or "env"


@dataclass(frozen=True, slots=True)
class EnvEvaluation:
    """The environment's own numbers for one model on the held-out rows."""

    model: str
    reward: float
    """The rubric's mean reward (NaN when every rollout failed)."""
    metrics: dict[str, float]
    """The mean of each reward function (the rubric's metrics)."""
    rollouts: int
    failed: int

    def line(self) -> str:
        shown = "  ".join(f"{k}={v:.3f}" for k, v in sorted(self.metrics.items()))
        return (
            f"{self.model}: reward {self.reward:.3f}  {shown}  "
            f"({self.rollouts} rollouts, {self.failed} failed)"
        )


@dataclass(frozen=True, slots=True)
class EnvRun:
    """What `train_environment` did."""

    model: str
    before: EnvEvaluation | None
    after: EnvEvaluation | None
    steps: PipelineRun
    failed_rollouts: int
    """Training rollouts that failed (recorded on their groups; the steps went on)."""
    run_dir: Path
    trained_steps: list[int] = field(default_factory=list)


def summarize(name: str, groups: list[TrajectoryGroup]) -> EnvEvaluation:
    trajectories = [t for g in groups for t in g.trajectories]
    failed = sum(len(g.failures) for g in groups)
    rewards = [t.reward for t in trajectories]
    keys = sorted({k for t in trajectories for k in t.metrics})
    metrics = {
        k: sum(t.metrics[k] for t in trajectories if k in t.metrics)
        / sum(1 for t in trajectories if k in t.metrics)
        for k in keys
    }
    reward = sum(rewards) / len(rewards) if rewards else math.nan
    return EnvEvaluation(name, reward, metrics, len(trajectories) + failed, failed)


def _sampling(config: EnvTrainConfig) -> dict[str, Any]:
    return {"max_tokens": config.max_tokens, "temperature": config.temperature}


async def _evaluate(
    env: Any, config: EnvTrainConfig, policy: TrainableModel, *, base: bool
) -> EnvEvaluation:
    held_out = rows(env, "eval", n=config.eval_rows, seed=config.seed)
    if base:  # the base weights behind the same endpoint, without an adapter
        base_name = served_base_name(config.base_model)  # how the endpoint names the base
        model: Model = Model(base_name, base_url=policy.api_base)
        runner = GroupRunner(env, model, model.openai_client(), _sampling(config))
        name = f"{config.base_model} (base)"
    else:
        runner = GroupRunner(env, policy, policy.openai_client(), _sampling(config))
        name = policy.served_name
    groups = await runner.groups(held_out, config.eval_samples)
    if not base:
        await policy.log(groups, split="val")
    return summarize(name, groups)


async def evaluate_environment(
    config: EnvTrainConfig, backend: LocalBackend | None = None
) -> tuple[EnvEvaluation, EnvEvaluation | None]:
    """The environment's numbers for the base model and, when the named model has
    trained steps, for its latest step."""
    env = load(config.env, config.env_args)
    policy = TrainableModel(config.model_name, config.project, config.base_model)
    async with _backend(config, backend) as active:
        await policy.register(active)
        before = await _evaluate(env, config, policy, base=True)
        after = await _evaluate(env, config, policy, base=False) if policy.step > 0 else None
    return before, after


async def train_environment(config: EnvTrainConfig, backend: LocalBackend | None = None) -> EnvRun:
    """Train the policy on the environment (see the module docstring)."""
    env = load(config.env, config.env_args)
    train_rows = rows(env, "train", seed=config.seed)
    policy = TrainableModel(
        config.model_name,
        config.project,
        config.base_model,
        config={"learning_rate": config.learning_rate},
    )
    failed = 0
    async with _backend(config, backend) as active:
        await policy.register(active)
        before = await _evaluate(env, config, policy, base=True) if config.eval_rows else None
        runner = GroupRunner(env, policy, policy.openai_client(), _sampling(config))

        async def batch(index: int) -> list[TrajectoryGroup]:
            nonlocal failed
            start = index * config.rows_per_step
            chosen = [
                train_rows[(start + i) % len(train_rows)] for i in range(config.rows_per_step)
            ]
            groups = await runner.groups(chosen, config.group_size)
            failed += sum(len(g.failures) for g in groups)
            return groups

        steps = await run_pipeline(policy, batch, until_step=policy.step + config.steps)
        after = await _evaluate(env, config, policy, base=False) if config.eval_rows else None
        run_dir = active.root / config.project / policy.name
    trained = [s.result.step for s in steps if s.result is not None and s.result.stats.trained]
    return EnvRun(policy.served_name, before, after, steps, failed, run_dir, trained)


class _backend:
    """The given backend (left running), or a new one under `config.root` (closed)."""

    def __init__(self, config: EnvTrainConfig, backend: LocalBackend | None) -> None:
        self._given = backend
        self._config = config
        self._own: LocalBackend | None = None

    async def __aenter__(self) -> LocalBackend:
        if self._given is not None:
            return self._given
        self._own = LocalBackend(self._config.root, engine={"kind": self._config.engine})
        return await self._own.__aenter__()

    async def __aexit__(self, *exc: Any) -> None:
        if self._own is not None:
            await self._own.__aexit__(*exc)
