"""`rlcoach env`: train and evaluate a `verifiers` environment from the command line."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from rlcoach import BUNDLED_MODEL, RLCoachError

app = typer.Typer(help="Train and evaluate verifiers environments.", no_args_is_help=True)

EnvArgument = Annotated[
    str, typer.Argument(help="An installed environment's id, or its .py file / folder.")
]
EnvArgs = Annotated[
    str, typer.Option("--env-args", help="load_environment()'s keyword arguments, as JSON.")
]


def _config(env: str, env_args: str, **fields: Any) -> Any:
    from pydantic import ValidationError

    from rlcoach.integrations.verifiers.train import EnvTrainConfig

    try:
        parsed = json.loads(env_args)
    except json.JSONDecodeError as e:
        raise _fail(f"--env-args {env_args!r} is not JSON ({e}); fix: e.g. '{{\"n\": 8}}'") from e
    if not isinstance(parsed, dict):
        raise _fail(f"--env-args {env_args!r} must be a JSON object of keyword arguments")
    try:
        return EnvTrainConfig(env=env, env_args=parsed, **fields)
    except ValidationError as e:
        raise _fail(str(e)) from e


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


@app.command()
def train(
    env: EnvArgument,
    env_args: EnvArgs = "{}",
    steps: Annotated[int, typer.Option(min=0, help="Training steps.")] = 4,
    rows_per_step: Annotated[int, typer.Option(min=1, help="Dataset rows per step.")] = 2,
    group_size: Annotated[int, typer.Option(min=2, help="Attempts per row.")] = 4,
    eval_rows: Annotated[int, typer.Option(min=0, help="Held-out rows (0: none).")] = 8,
    max_tokens: Annotated[int, typer.Option(min=1, help="Tokens per reply.")] = 128,
    learning_rate: Annotated[float, typer.Option(min=0.0)] = 1e-3,
    model: Annotated[str, typer.Option(help="Base model to train.")] = BUNDLED_MODEL,
    name: Annotated[str | None, typer.Option(help="Model name (an existing one resumes).")] = None,
    engine: Annotated[str, typer.Option(help="vllm or transformers.")] = "vllm",
    root: Annotated[Path, typer.Option(help="Where runs are written.")] = Path(".rlcoach"),
) -> None:
    """Train a model on a verifiers environment; print its metrics before and after."""
    from rlcoach.integrations.verifiers.train import train_environment

    config = _config(
        env,
        env_args,
        steps=steps,
        rows_per_step=rows_per_step,
        group_size=group_size,
        eval_rows=eval_rows,
        max_tokens=max_tokens,
        learning_rate=learning_rate,
        base_model=model,
        name=name,
        engine=engine,
        root=root,
    )
    try:
        run = asyncio.run(train_environment(config))
    except RLCoachError as e:
        raise _fail(_with_cause(e)) from e
    for step in run.steps:
        if step.result is not None:
            stats = step.result.stats
            typer.echo(
                f"step {step.result.step}: {'trained' if stats.trained else 'skipped'}, "
                f"loss {stats.loss:+.4f}"
            )
        else:
            typer.echo(f"step from {step.trained_from} failed: {step.error}")
    if run.before is not None:
        typer.echo(f"before  {run.before.line()}")
    if run.after is not None:
        typer.echo(f"after   {run.after.line()}")
    typer.echo(f"failed rollouts: {run.failed_rollouts}; run: {run.run_dir}")


@app.command("eval")
def evaluate(
    env: EnvArgument,
    env_args: EnvArgs = "{}",
    eval_rows: Annotated[int, typer.Option(min=1, help="Held-out rows.")] = 8,
    samples: Annotated[int, typer.Option(min=1, help="Attempts per row.")] = 1,
    max_tokens: Annotated[int, typer.Option(min=1, help="Tokens per reply.")] = 128,
    model: Annotated[str, typer.Option(help="Base model.")] = BUNDLED_MODEL,
    name: Annotated[str | None, typer.Option(help="The trained model's name.")] = None,
    engine: Annotated[str, typer.Option(help="vllm or transformers.")] = "vllm",
    root: Annotated[Path, typer.Option(help="Where runs are written.")] = Path(".rlcoach"),
) -> None:
    """Print the environment's own metrics for the base model and the trained one."""
    from rlcoach.integrations.verifiers.train import evaluate_environment

    config = _config(
        env,
        env_args,
        eval_rows=eval_rows,
        eval_samples=samples,
        max_tokens=max_tokens,
        base_model=model,
        name=name,
        engine=engine,
        root=root,
    )
    try:
        base, trained = asyncio.run(evaluate_environment(config))
    except RLCoachError as e:
        raise _fail(_with_cause(e)) from e
    typer.echo(f"base     {base.line()}")
    typer.echo(f"trained  {trained.line()}" if trained else "trained  (no trained steps yet)")


def _with_cause(error: BaseException) -> str:
    """The message, and the environment's own traceback when it caused the error."""
    import traceback

    cause = error.__cause__
    if cause is None:
        return str(error)
    return f"{error}\n\n{''.join(traceback.format_exception(cause))}"
