"""`rlcoach mcp tools|train`: inspect an MCP server, or train the policy to use it.

    rlcoach mcp tools --server "python -m rlcoach.integrations.mcp.inventory"
    rlcoach mcp train --server "mcp-server-time" --steps 4
    rlcoach mcp train --url http://127.0.0.1:8765/mcp --header-env "Authorization=MCP_AUTH"

Secrets stay off the command line, which every user of the machine can read: a header's
value can come from an environment variable (`--header-env Name=VAR`), and `--env NAME`
(no `=`) passes this process's `$NAME` to the server process. A value written inline
(`--header "Name: value"`, `--env NAME=value`) still works, with a warning.

The core CLI finds these commands through the `rlcoach.cli` entry point.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from rlcoach.integrations.mcp.agent import AgentConfig
from rlcoach.integrations.mcp.train_config import MCPTrainConfig
from rlcoach.models.bundled import BUNDLED_MODEL

_D = {name: field.default for name, field in MCPTrainConfig.model_fields.items()}
_A = {name: field.default for name, field in AgentConfig.model_fields.items()}
"""`mcp train`'s defaults are the configs' (one place to change them)."""

app = typer.Typer(help="Train tool use against an MCP server.", no_args_is_help=True)

ServerOption = Annotated[
    str | None,
    typer.Option("--server", help='The server\'s launch command (stdio), e.g. "mcp-server-time".'),
]
UrlOption = Annotated[str | None, typer.Option(help="A streamable-HTTP server URL.")]
HeaderOption = Annotated[
    list[str] | None,
    typer.Option("--header", help='An HTTP header for --url, as "Name: value" (repeatable).'),
]
EnvOption = Annotated[
    list[str] | None,
    typer.Option(
        "--env",
        help="An environment variable for the --server process: NAME (its value here) or "
        "NAME=value.",
    ),
]
HeaderEnvOption = Annotated[
    list[str] | None,
    typer.Option(
        "--header-env",
        help='An HTTP header for --url whose value is in an environment variable, "Name=VAR".',
    ),
]


def _from_environment(variable: str, option: str) -> str:
    import os

    value = os.environ.get(variable)
    if value is None:
        raise typer.BadParameter(f"{option} names ${variable}, which is not set")
    return value


def server_spec(
    server: str | None,
    url: str | None,
    headers: list[str] | None,
    env: list[str] | None,
    startup_timeout_s: float = 60.0,
    header_env: list[str] | None = None,
) -> Any:
    """A `ServerSpec` from the command-line options, or a usage error naming the fix."""
    from rlcoach.integrations.mcp.connection import ServerSpec

    if (server is None) == (url is None):
        raise typer.BadParameter(
            'give exactly one of --server "<command>" (stdio) or --url <address> (streamable HTTP)'
        )
    parsed_headers = {}
    for header in headers or []:
        key, sep, value = header.partition(":")
        if not sep or not key.strip():
            raise typer.BadParameter(f'--header {header!r} is not "Name: value"')
        parsed_headers[key.strip()] = value.strip()
        _warn_inline("--header", key.strip())
    for item in header_env or []:
        key, sep, variable = item.partition("=")
        if not sep or not key.strip() or not variable:
            raise typer.BadParameter(f'--header-env {item!r} is not "Name=VARIABLE"')
        parsed_headers[key.strip()] = _from_environment(variable, "--header-env")
    parsed_env = {}
    for item in env or []:
        key, sep, value = item.partition("=")
        if not key:
            raise typer.BadParameter(f"--env {item!r} is not NAME or NAME=value")
        if sep:
            _warn_inline("--env", key)
        parsed_env[key] = value if sep else _from_environment(key, "--env")
    if url is not None:
        if parsed_env:
            raise typer.BadParameter("--env applies to a --server process, not to --url")
        return ServerSpec(url=url, headers=parsed_headers, startup_timeout_s=startup_timeout_s)
    if parsed_headers:
        raise typer.BadParameter("--header applies to --url, not to a --server command")
    return ServerSpec.from_command(server, env=parsed_env, startup_timeout_s=startup_timeout_s)


def _warn_inline(option: str, name: str) -> None:
    import logging

    logging.getLogger(__name__).warning(
        "%s %s: a value on the command line is visible to every user of this machine "
        "(ps, /proc); if it is a secret, use %s instead",
        option,
        name,
        "--header-env Name=VAR" if option == "--header" else f"--env {name} (no =value)",
    )


def read_examples(path: Path) -> list[dict[str, Any]]:
    """Worked examples from a JSON list or JSON lines."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise typer.BadParameter(f"--examples {path}: {e}") from e
    try:
        data = json.loads(text)
        return data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        pass
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise typer.BadParameter(f"--examples {path}:{number} is not JSON: {e}") from e
    return rows


def _fail(error: Exception) -> typer.Exit:
    typer.echo(f"error: {error}", err=True)
    return typer.Exit(2)


@app.command()
def tools(
    server: ServerOption = None,
    url: UrlOption = None,
    header: HeaderOption = None,
    env: EnvOption = None,
    header_env: HeaderEnvOption = None,
) -> None:
    """List the server's tools as the policy sees them (OpenAI schemas), what was skipped,
    and each tool's safety verdict (`mcp train` calls only the safe ones by default)."""
    from rlcoach.errors import RLCoachError
    from rlcoach.integrations.mcp.discovery import discover

    spec = server_spec(server, url, header, env, header_env=header_env)
    try:
        found = asyncio.run(discover(spec, demonstration=False, allow_unsafe=True))
    except RLCoachError as e:
        raise _fail(e) from e
    typer.echo(
        json.dumps(
            {
                "server": found.server_name,
                "tools": found.tools.tools,
                "skipped": found.tools.skipped,
                "safety": {
                    name: {"safe": verdict.safe, "rule": verdict.rule}
                    for name, verdict in found.safety.items()
                },
                "renamed": found.tools.renamed,
                "resources": found.resources,
                "prompts": found.prompts,
            },
            indent=2,
        )
    )


@app.command()
def train(
    server: ServerOption = None,
    url: UrlOption = None,
    header: HeaderOption = None,
    env: EnvOption = None,
    header_env: HeaderEnvOption = None,
    model: Annotated[str, typer.Option(help="Base model to train.")] = BUNDLED_MODEL,
    steps: Annotated[int, typer.Option(min=0, help="Training steps.")] = _D["steps"],
    scenarios: Annotated[int, typer.Option(min=2, help="Scenarios to write.")] = _D["scenarios"],
    scenarios_file: Annotated[
        Path | None, typer.Option(help="Scenarios as AutoRL JSONL instead of generating them.")
    ] = None,
    eval_fraction: Annotated[float, typer.Option(min=0.01, max=0.95)] = _D["eval_fraction"],
    scenarios_per_step: Annotated[int, typer.Option(min=1)] = _D["scenarios_per_step"],
    group_size: Annotated[int, typer.Option(min=2, help="Attempts per scenario.")] = _D[
        "group_size"
    ],
    eval_samples: Annotated[int, typer.Option(min=1, help="Attempts per held-out scenario.")] = _D[
        "eval_samples"
    ],
    eval_temperature: Annotated[
        float, typer.Option(min=0.0, max=2.0, help="Held-out sampling temperature (0: greedy).")
    ] = _D["eval_temperature"],
    max_turns: Annotated[int, typer.Option(min=1)] = _A["max_turns"],
    call_timeout: Annotated[float, typer.Option(help="Seconds per tool call.")] = _A[
        "call_timeout_s"
    ],
    rollout_timeout: Annotated[float, typer.Option(help="Seconds per rollout.")] = _A[
        "rollout_timeout_s"
    ],
    result_chars: Annotated[int, typer.Option(min=40, help="Tool results cut to this.")] = _A[
        "result_chars"
    ],
    max_tokens: Annotated[int, typer.Option(min=8, help="Tokens per policy reply.")] = _A[
        "max_tokens"
    ],
    system_prompt: Annotated[str | None, typer.Option(help="The agent's system prompt.")] = None,
    first_tool_choice: Annotated[
        str,
        typer.Option(
            help="tool_choice of the agent's first reply: required (a call that fits a "
            "tool's schema) or auto (it may answer without one)."
        ),
    ] = _A["first_tool_choice"],
    call_max_tokens: Annotated[
        int, typer.Option(min=8, help="Tokens of a forced first reply: room for its values.")
    ] = _A["call_max_tokens"],
    strict_tools: Annotated[
        bool,
        typer.Option(help="Offer the tools strict: every call fits its tool's schema."),
    ] = _A["strict_tools"],
    demonstration: Annotated[
        bool, typer.Option(help="A worked example from a real call before each task.")
    ] = False,
    examples: Annotated[
        Path | None,
        typer.Option(
            help="Worked examples (JSON list or JSONL of {request, tool, arguments, answer}) "
            "to show instead of the automatic one."
        ),
    ] = None,
    warmup_epochs: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="SFT epochs on the worked examples before RL (0: none; default: 4 when "
            "the base model's held-out success is below 0.1).",
        ),
    ] = None,
    allow_unsafe_tools: Annotated[
        bool,
        typer.Option(
            help="Call (while exploring) and offer the policy the tools judged unsafe "
            "(annotated as writing, or named/described as writing, deleting, sending, buying)."
        ),
    ] = _D["allow_unsafe_tools"],
    explore_budget: Annotated[
        float, typer.Option(min=1.0, help="Seconds at most for exploring the server.")
    ] = _D["explore_budget_s"],
    check: Annotated[
        str | None,
        typer.Option(help="module:function scoring a rollout in [0, 1] (default: grounded_check)."),
    ] = None,
    generator_url: Annotated[str | None, typer.Option(help="Scenario writer's base URL.")] = None,
    generator_model: str = BUNDLED_MODEL,
    generator_key_env: str | None = None,
    judge_url: Annotated[str | None, typer.Option(help="RULER judge's base URL.")] = None,
    judge_model: str | None = None,
    judge_key_env: str | None = None,
    judge_weight: Annotated[float, typer.Option(min=0.0, max=1.0)] = _D["judge_weight"],
    learning_rate: Annotated[float, typer.Option(min=0.0)] = _D["learning_rate"],
    eval_every: Annotated[
        int, typer.Option(min=0, help="Evaluate held out every N RL steps (0: after the last).")
    ] = _D["eval_every"],
    patience: Annotated[
        int,
        typer.Option(min=1, help="Stop RL after N evaluations below the best (ties not counted)."),
    ] = _D["patience"],
    refill_rounds: Annotated[
        int,
        typer.Option(
            min=0,
            help="Rounds per step that replace scenarios whose attempts all scored the same "
            "(DAPO's dynamic sampling; 0: off).",
        ),
    ] = _D["refill_rounds"],
    keep_best: Annotated[
        bool, typer.Option(help="Serve the best checkpoint by held-out success at the end.")
    ] = _D["keep_best"],
    name: Annotated[str | None, typer.Option(help="Model name (an existing one resumes).")] = None,
    engine: Annotated[str, typer.Option(help="vllm or transformers.")] = "vllm",
    root: Annotated[Path, typer.Option(help="Where runs are written.")] = Path(".rlcoach"),
    seed: int = _D["seed"],
) -> None:
    """Explore the server's safe tools, write grounded scenarios from the calls that worked,
    evaluate held out, warm up (SFT) when needed, train, evaluate again, write a report."""
    from pydantic import ValidationError

    from rlcoach.errors import RLCoachError
    from rlcoach.integrations.mcp.agent import DEFAULT_SYSTEM
    from rlcoach.integrations.mcp.train import train_on_server
    from rlcoach.integrations.mcp.train_config import Endpoint

    spec = server_spec(server, url, header, env, header_env=header_env)
    if (judge_url is None) != (judge_model is None):
        raise typer.BadParameter("a judge needs both --judge-url and --judge-model")
    try:
        config = MCPTrainConfig(
            server=spec,
            base_model=model,
            name=name,
            steps=steps,
            scenarios=scenarios,
            scenarios_file=scenarios_file,
            eval_fraction=eval_fraction,
            scenarios_per_step=scenarios_per_step,
            group_size=group_size,
            eval_samples=eval_samples,
            eval_temperature=eval_temperature,
            demonstration=demonstration,
            examples=read_examples(examples) if examples else [],
            check=check,
            warmup_epochs=warmup_epochs,
            allow_unsafe_tools=allow_unsafe_tools,
            explore_budget_s=explore_budget,
            agent=AgentConfig(
                max_turns=max_turns,
                call_timeout_s=call_timeout,
                rollout_timeout_s=rollout_timeout,
                result_chars=result_chars,
                max_tokens=max_tokens,
                system_prompt=system_prompt or DEFAULT_SYSTEM,
                first_tool_choice=first_tool_choice,
                call_max_tokens=call_max_tokens,
                strict_tools=strict_tools,
            ),
            generator=Endpoint(
                url=generator_url, model=generator_model, api_key_env=generator_key_env
            )
            if generator_url
            else None,
            judge=Endpoint(url=judge_url, model=judge_model, api_key_env=judge_key_env)
            if judge_url and judge_model
            else None,
            judge_weight=judge_weight,
            learning_rate=learning_rate,
            eval_every=eval_every,
            patience=patience,
            keep_best=keep_best,
            refill_rounds=refill_rounds,
            engine=engine,
            root=root,
            seed=seed,
        )
        report = asyncio.run(train_on_server(config))
    except (RLCoachError, ValidationError) as e:
        raise _fail(e) from e
    before, after = report["eval_before"], report["eval_after"]
    sft = (report.get("warmup") or {}).get("eval")
    typer.echo(
        f"result: success_before={before['success']:.3f} "
        + (f"success_sft={sft['success']:.3f} " if sft else "")
        + f"success_after={after['success']:.3f} served={report['served']} lora={report['lora']} "
        f"report={report['run_dir']}/report.md"
    )
