"""The `rlcoach` command line."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Train LLM agents with reinforcement learning.", no_args_is_help=True)


@app.callback()
def main(verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@app.command()
def demo(
    steps: Annotated[int, typer.Option(min=1, help="Training steps.")] = 8,
    questions_per_step: Annotated[int, typer.Option(min=1)] = 2,
    group_size: Annotated[int, typer.Option(min=2, help="Attempts per question.")] = 8,
    eval_questions: Annotated[int, typer.Option(min=1)] = 48,
    eval_samples: Annotated[int, typer.Option(min=1)] = 2,
    learning_rate: Annotated[float, typer.Option(min=0.0)] = 1e-3,
    engine: Annotated[str, typer.Option(help="vllm or transformers.")] = "vllm",
    root: Annotated[Path, typer.Option(help="Where runs are written.")] = Path(".rlcoach"),
    seed: int = 0,
    resume: Annotated[str | None, typer.Option(help="Continue this demo model.")] = None,
) -> None:
    """Train the bundled model to use an `add` tool; print success before and after."""
    from rlcoach.demo.run import DemoConfig, run_demo
    from rlcoach.errors import RLCoachError

    config = DemoConfig(
        steps=steps,
        questions_per_step=questions_per_step,
        group_size=group_size,
        eval_questions=eval_questions,
        eval_samples=eval_samples,
        learning_rate=learning_rate,
        engine=engine,
        root=root,
        seed=seed,
        resume=resume,
    )
    try:
        result = asyncio.run(run_demo(config))
    except RLCoachError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    typer.echo(result.summary())


@app.command()
def serve(
    host: Annotated[
        str, typer.Option(help="Interface to bind (default: this machine only).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535)] = 8000,
    root: Annotated[Path, typer.Option(help="Where runs are written.")] = Path(".rlcoach"),
    base_model: Annotated[
        str | None, typer.Option(help="A model folder (default: the bundled model).")
    ] = None,
    engine: Annotated[
        str, typer.Option(help="vllm, transformers or transformers-process.")
    ] = "vllm",
    max_request_mb: Annotated[int, typer.Option(min=1, help="Largest training upload.")] = 64,
    max_concurrent_chats: Annotated[int, typer.Option(min=1)] = 256,
    max_queued_chats: Annotated[int, typer.Option(min=0)] = 1024,
    queue_timeout_s: Annotated[
        float, typer.Option(min=0.001, help="Longest wait for an engine slot (then 429).")
    ] = 300.0,
    max_model_len: Annotated[int, typer.Option(min=128)] = 4096,
    upload_timeout_s: Annotated[
        float, typer.Option(min=0.001, help="Longest time a body may take to arrive (408).")
    ] = 300.0,
    max_lora_rank: Annotated[
        int, typer.Option(min=1, help="Largest LoRA rank the engine serves.")
    ] = 16,
    insecure: Annotated[
        bool, typer.Option(help="Allow a bind other than loopback without an API key.")
    ] = False,
    allowed_host: Annotated[
        list[str] | None, typer.Option(help="Another name clients use in Host (repeatable).")
    ] = None,
    allowed_origin: Annotated[
        list[str] | None, typer.Option(help="A web origin whose requests are accepted.")
    ] = None,
    ssl_certfile: Annotated[Path | None, typer.Option(help="Serve HTTPS: certificate.")] = None,
    ssl_keyfile: Annotated[Path | None, typer.Option(help="Serve HTTPS: private key.")] = None,
    keep_last: Annotated[
        int | None, typer.Option(min=1, help="Newest checkpoints kept (default: all).")
    ] = None,
    keep_best: Annotated[
        int, typer.Option(min=0, help="Also keep the best N steps by --best-metric.")
    ] = 0,
    best_metric: Annotated[str, typer.Option(help="A number in metrics.jsonl.")] = "reward_mean",
    pin: Annotated[list[int] | None, typer.Option(help="A step never pruned (repeatable).")] = None,
) -> None:
    """Serve the policy endpoint and training over HTTP (key: $RLCOACH_API_KEY)."""
    import os

    from pydantic import ValidationError

    from rlcoach.errors import RLCoachError
    from rlcoach.serve.serve_config import ServeConfig
    from rlcoach.serve.server import serve

    try:
        extra = {"base_model": base_model} if base_model else {}
        config = ServeConfig(
            host=host,
            port=port,
            root=root,
            **extra,
            engine={
                "kind": engine,
                "max_model_len": max_model_len,
                "max_lora_rank": max_lora_rank,
            },
            max_request_bytes=max_request_mb * 1024 * 1024,
            max_concurrent_chats=max_concurrent_chats,
            max_queued_chats=max_queued_chats,
            queue_timeout_s=queue_timeout_s,
            upload_timeout_s=upload_timeout_s,
            insecure=insecure,
            allowed_hosts=allowed_host or [],
            allowed_origins=allowed_origin or [],
            ssl_certfile=ssl_certfile,
            ssl_keyfile=ssl_keyfile,
            retention={
                "keep_last": keep_last,
                "keep_best": keep_best,
                "best_metric": best_metric,
                "pinned": pin or [],
            },
        )
        # Taken out of the environment: no child (engine, its watchdog, training ranks)
        # inherits the key.
        serve(config, os.environ.pop("RLCOACH_API_KEY", None) or None)
    except (RLCoachError, ValidationError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e


@app.command()
def sft(
    data: Annotated[Path, typer.Argument(help="JSONL of chat records or trajectory groups.")],
    name: Annotated[str, typer.Option(help="The model to train (an existing one continues).")],
    project: Annotated[str, typer.Option(help="The model's project.")] = "sft",
    base_model: Annotated[
        str | None, typer.Option(help="A model folder (default: the bundled model).")
    ] = None,
    epochs: Annotated[int, typer.Option(min=1)] = 1,
    batch_size: Annotated[int, typer.Option(min=1, help="Sequences per optimizer step.")] = 8,
    learning_rate: Annotated[float, typer.Option(min=0.0)] = 2e-4,
    engine: Annotated[
        str, typer.Option(help="transformers (no server needed) or vllm.")
    ] = "transformers",
    root: Annotated[Path, typer.Option(help="Where runs are written.")] = Path(".rlcoach"),
    seed: int = 0,
) -> None:
    """Fine-tune a model's LoRA on conversations (assistant turns only) as one step."""
    from pydantic import ValidationError

    from rlcoach.backend.local import LocalBackend
    from rlcoach.config import SFTConfig
    from rlcoach.errors import RLCoachError
    from rlcoach.model import TrainableModel
    from rlcoach.models.bundled import BUNDLED_MODEL
    from rlcoach.trainer.base import SFTStats
    from rlcoach.trainer.sft import load_sft_file

    async def run() -> str:
        items = load_sft_file(data)
        config = SFTConfig(
            epochs=epochs, batch_size=batch_size, learning_rate=learning_rate, seed=seed
        )
        model = TrainableModel(name, project, base_model or BUNDLED_MODEL)
        async with LocalBackend(root, engine={"kind": engine}) as backend:
            await model.register(backend)
            result = await model.train_sft(items, config, progress=True)
        s = result.stats
        assert isinstance(s, SFTStats)  # train_sft's
        return (
            f"sft: {s.examples} examples, {s.sequences} sequences, {s.trained_tokens} "
            f"trained tokens, {s.optimizer_steps} optimizer steps, loss "
            f"{s.loss_first:.3f} -> {s.loss_last:.3f}; {model.served_name} at "
            f"{result.checkpoint}"
        )

    try:
        typer.echo(asyncio.run(run()))
    except (RLCoachError, ValidationError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e


@app.command()
def report(
    run: Annotated[Path, typer.Argument(help="A run folder: <root>/<project>/<model>.")],
    samples: Annotated[int, typer.Option(min=0, help="Trajectories shown per step.")] = 4,
    tokenizer: Annotated[
        Path | None, typer.Option(help="Tokenizer folder (default: the run's base model).")
    ] = None,
    output: Annotated[Path | None, typer.Option(help="Default: <run>/report.html.")] = None,
) -> None:
    """Write a static HTML report of a run: curves, a table per step, trajectories."""
    from rlcoach.errors import RLCoachError
    from rlcoach.observe.report import write_report

    try:
        path = write_report(run, samples_per_step=samples, tokenizer=tokenizer, output=output)
    except (RLCoachError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    typer.echo(f"report: {path}")


@app.command()
def init(
    folder: Annotated[Path, typer.Argument(help="The project to write into.")] = Path("."),
    skill_dir: Annotated[
        Path, typer.Option(help="Where SKILL.md goes, inside the project.")
    ] = Path(".claude/skills/rlcoach"),
    force: Annotated[bool, typer.Option(help="Replace files that already exist.")] = False,
) -> None:
    """Write AGENTS.md and a SKILL.md that teach a coding agent to train with rlcoach."""
    from rlcoach.errors import RLCoachError
    from rlcoach.guide import write_guide

    try:
        written = write_guide(folder, skill_dir=skill_dir, force=force)
    except (RLCoachError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    for path in written:
        typer.echo(f"wrote {path}")


def _add_plugin_commands() -> None:
    """Sub-commands that plugins declare under the `rlcoach.cli` entry point group."""
    from importlib.metadata import entry_points

    for entry in entry_points(group="rlcoach.cli"):
        try:
            app.add_typer(entry.load(), name=entry.name)
        except Exception as e:  # a broken plugin must not take the whole CLI down
            logging.getLogger(__name__).warning("skipping the %r command: %r", entry.name, e)


_add_plugin_commands()

if __name__ == "__main__":
    app()
