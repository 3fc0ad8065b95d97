"""`rlcoach autorl generate "<task description>" --n 200 --out data/`, and
`rlcoach autorl generate --mcp "<server command or URL>"` for tool-using scenarios.

Generates inputs (exact, near-duplicate and embedding-similar ones removed), a system
prompt, and a deterministic train/eval split, written as `train.jsonl`, `eval.jsonl`
and `dataset.json` (the task, the system prompt, the generator, its usage, the counts).
With no `--generator-url` the bundled 135M model generates, served by a local vLLM
server started for the purpose: every guarantee holds, but its inputs are weak — pass a
stronger OpenAI-compatible model for real datasets. The core CLI finds this command
through the `rlcoach.cli` entry point. `--mcp` asks the plugin registered under the
`rlcoach.tool_sources` entry point (`rlcoach[mcp]`) for the server's tools and resources,
so AutoRL itself never imports an MCP client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from rlcoach.models.bundled import BUNDLED_MODEL

app = typer.Typer(
    help="Generate training inputs from a task description (AutoRL).", no_args_is_help=True
)

logger = logging.getLogger(__name__)


async def _tool_source(target: str) -> tuple[list[Any], str | None]:
    from importlib.metadata import entry_points

    from rlcoach.errors import ConfigError

    found = [e for e in entry_points(group="rlcoach.tool_sources") if e.name == "mcp"]
    if not found:
        raise ConfigError("--mcp needs the MCP plugin: pip install 'rlcoach[mcp]'")
    return await found[0].load()(target)


async def _run(
    task: str | None,
    mcp: str | None,
    n: int,
    out: Path,
    eval_fraction: float,
    seed: int,
    generator_url: str | None,
    generator_model: str,
    api_key_env: str | None,
    batch_size: int,
    system_prompt: bool,
    embeddings: bool,
) -> dict[str, Any]:
    from rlcoach.autorl.embeddings import minilm_embedder
    from rlcoach.autorl.generate import GenerationError, generate_inputs, generate_scenarios
    from rlcoach.autorl.prompt import generate_system_prompt
    from rlcoach.autorl.split import save_dataset, split_records
    from rlcoach.backend.local import LocalBackend
    from rlcoach.model import Model, TrainableModel
    from rlcoach.models.usage import ModelUsage

    usage = ModelUsage()
    tools: list[Any] = []
    resources = None
    if mcp is not None:
        tools, resources = await _tool_source(mcp)
        typer.echo(
            f"{len(tools)} tools from {mcp}: {', '.join(t['function']['name'] for t in tools)}",
            err=True,
        )
    embed = minilm_embedder() if embeddings else None
    async with contextlib.AsyncExitStack() as stack:
        if generator_url is None:
            typer.echo(
                "no --generator-url: generating with the bundled 135M model on a local "
                "vLLM server (weak inputs; use a stronger model for real datasets)",
                err=True,
            )
            root = stack.enter_context(tempfile.TemporaryDirectory(prefix="rlcoach-autorl-"))
            backend = await stack.enter_async_context(LocalBackend(root))
            await TrainableModel("autorl-generator", "autorl").register(backend)
            generator = Model(BUNDLED_MODEL, base_url=backend.url + "/v1")
        else:
            generator = Model(generator_model, base_url=generator_url, api_key_env=api_key_env)
        config = {"batch_size": batch_size, "seed": seed}
        try:
            if mcp is not None:
                purpose = f"The agent's purpose: {task}" if task else None
                context = "\n\n".join(p for p in (purpose, resources) if p) or None
                records = await generate_scenarios(
                    tools, n, generator, resources=context, usage=usage, embed=embed, config=config
                )
            else:
                assert task is not None
                records = await generate_inputs(
                    task, n, generator, usage=usage, embed=embed, config=config
                )
        except GenerationError as e:
            typer.echo(f"warning: {e}; saving the {len(e.records)} generated", err=True)
            records = e.records
        prompt = None
        described = task or (
            f"Use these tools to serve the user: {', '.join(t['function']['name'] for t in tools)}"
        )
        if system_prompt:
            try:
                prompt = await generate_system_prompt(
                    described, generator, examples=records, usage=usage
                )
            except GenerationError as e:
                typer.echo(f"warning: {e}; the dataset has no system prompt", err=True)
    train, evaluation = split_records(records, eval_fraction, seed)
    manifest = {
        "task": task,
        "mcp": mcp,
        "tools": [t["function"]["name"] for t in tools],
        "system_prompt": prompt,
        "requested": n,
        "seed": seed,
        "eval_fraction": eval_fraction,
        "generator": generator.name,
        "generator_url": generator_url,
        "embeddings": embed is not None,
        "usage": usage.model_dump(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    save_dataset(out, train, evaluation, manifest)
    return {"train": len(train), "eval": len(evaluation), "usage": usage}


@app.command()
def generate(
    task: Annotated[
        str | None, typer.Argument(help="What the agent is for, in a sentence or two.")
    ] = None,
    mcp: Annotated[
        str | None,
        typer.Option(
            help="An MCP server (launch command or http(s) URL): write tool-using scenarios "
            "for its tools."
        ),
    ] = None,
    n: Annotated[int, typer.Option(min=1, help="Inputs to generate.")] = 200,
    out: Annotated[Path, typer.Option(help="Folder for train/eval JSONL.")] = Path("data"),
    eval_fraction: Annotated[float, typer.Option(min=0.0, max=0.95)] = 0.2,
    seed: int = 0,
    generator_url: Annotated[str | None, typer.Option(help="OpenAI-compatible base URL.")] = None,
    generator_model: str = BUNDLED_MODEL,
    api_key_env: Annotated[str | None, typer.Option(help="Env var holding the key.")] = None,
    batch_size: Annotated[int, typer.Option(min=1, max=50)] = 8,
    system_prompt: Annotated[bool, typer.Option(help="Also write a system prompt.")] = True,
    embeddings: Annotated[bool, typer.Option(help="Embedding near-duplicates.")] = True,
) -> None:
    """Generate a train/eval dataset of inputs for the task (or an MCP server's tools)."""
    from rlcoach.errors import RLCoachError

    if task is None and mcp is None:
        raise typer.BadParameter('give a task description, or --mcp "<server command>"')

    try:
        result = asyncio.run(
            _run(
                task,
                mcp,
                n,
                out,
                eval_fraction,
                seed,
                generator_url,
                generator_model,
                api_key_env,
                batch_size,
                system_prompt,
                embeddings,
            )
        )
    except RLCoachError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    usage = result["usage"]
    typer.echo(
        f"wrote {result['train']} train and {result['eval']} eval inputs to {out}/ "
        f"(generator: {usage.calls} calls, {usage.prompt_tokens}+"
        f"{usage.completion_tokens} tokens)"
    )
