"""Train tool use against an MCP server, end to end (`rlcoach mcp train`).

`train_on_server(config)`: discover the server's tools (and its resources, as context),
judge each tool safe or not (`safety.py`, the rule printed per tool; unsafe tools are
neither called nor offered unless allowed), explore the safe ones in a private working
directory and home (`explore.py`), write grounded scenarios from the calls that worked
with their real results as answer keys (`scenarios.py`; a named generator rephrases and
AutoRL's generation is blended in; or read them from a JSONL file), split them by call
into train and held out, measure the base model's held-out success, fine-tune on worked
examples of the training calls when that success is near zero (the SFT warm-up), train
`steps` GRPO steps (reward: `grounded_check` — the key facts of the real result, with
partial credit for the right tool and valid arguments — blended with RULER when a judge
is given), measure again and write `report.json`, `report.md` and `exploration.json` in
the model's run folder. Every file is written atomically; a failed rollout is counted
and the step goes on.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from functools import partial
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from rlcoach.autorl.grounded import answer_facts, split_by_call
from rlcoach.autorl.split import load_records, save_dataset
from rlcoach.autorl.types import InputRecord
from rlcoach.backend.local import LocalBackend
from rlcoach.backend.pipeline import PipelineRun, PipelineStep, Validation, run_pipeline
from rlcoach.errors import ConfigError
from rlcoach.integrations.mcp.agent import AgentConfig, Check, offered_tools, run_agent
from rlcoach.integrations.mcp.connection import ServerSpec
from rlcoach.integrations.mcp.discovery import Discovery, discover, load_check
from rlcoach.integrations.mcp.explore import Exploration, sandboxed
from rlcoach.integrations.mcp.report import exploration_summary, report_markdown
from rlcoach.integrations.mcp.reward import grounded_check
from rlcoach.integrations.mcp.scenarios import blend_generated, server_scenarios, worked_examples
from rlcoach.integrations.mcp.selection import HeldOutCurve
from rlcoach.integrations.mcp.train_config import MCPTrainConfig
from rlcoach.model import TrainableModel
from rlcoach.models.usage import ModelUsage
from rlcoach.paths import RunPaths, append_jsonl, write_text_atomic
from rlcoach.rollout.gather import gather_trajectory_groups
from rlcoach.trajectory.dataset import iterate_dataset
from rlcoach.trajectory.trajectories import ChatRecord, Message, TrajectoryGroup, save_groups

__all__ = ["MCPTrainConfig", "summarize", "train_on_server"]

PROJECT = "mcp"


def _log(line: str) -> None:
    tqdm.write(line)


def summarize(groups: list[TrajectoryGroup]) -> dict[str, float]:
    """Per-rollout averages of a batch of groups (failed rollouts count as unsuccessful)."""
    trajectories = [t for g in groups for t in g.trajectories]
    failed = sum(len(g.failures) for g in groups)
    total = len(trajectories) + failed

    def mean(key: str) -> float:
        return sum(t.metrics.get(key, 0.0) for t in trajectories) / total if total else 0.0

    # -log p of each sampled token (a constraint's forced tokens excluded): the policy's
    # sampling entropy, as estimated on its own samples. A warm-up that drives it to ~0
    # has learned its examples by heart, and GRPO's groups then barely differ.
    nll = [
        -p
        for t in trajectories
        for h in t.histories()
        for c in h.choices
        for i, p in enumerate(c.logprobs)
        if p == p and i not in c.forced
    ]
    calls = sum(t.metrics.get("tool_calls", 0.0) for t in trajectories)
    bad = sum(
        t.metrics.get("tool_errors", 0.0) + t.metrics.get("invalid_calls", 0.0)
        for t in trajectories
    )
    return {
        "rollouts": float(total),
        "failed": float(failed),
        "reward": sum(t.reward for t in trajectories) / total if total else 0.0,
        "success": mean("success"),
        "finished": mean("finished"),
        "tool_calls_per_rollout": mean("tool_calls"),
        "tool_error_rate": bad / calls if calls else 0.0,
        "invalid_call_rate": sum(t.metrics.get("invalid_calls", 0.0) for t in trajectories) / calls
        if calls
        else 0.0,
        "sampled_nll": sum(nll) / len(nll) if nll else 0.0,
    }


async def _scenarios(
    config: MCPTrainConfig,
    found: Discovery,
    sandbox: Path,
    usage: ModelUsage,
) -> tuple[Exploration | None, list[InputRecord]]:
    """The scenarios file's records, or grounded scenarios from exploring the server
    (blended with a named generator's)."""
    if config.scenarios_file is not None:
        records = load_records(config.scenarios_file)
        _log(f"read {len(records)} scenarios from {config.scenarios_file}")
        return None, records
    _log(f"exploring {config.server.label} in {sandbox}")
    explored, records = await server_scenarios(
        config.server,
        found.tools,
        found.safety,
        config.scenarios,
        sandbox=sandbox,
        budget_s=config.explore_budget_s,
        seed=config.seed,
        result_chars=config.agent.result_chars,
    )
    for tool in explored.tools:
        if tool.called:
            _log(
                f"explored {tool.name}: {tool.calls} calls, {tool.worked} with usable "
                f"answers, {len(tool.lessons)} lessons from errors"
                + (f"; crashed: {tool.crashed[:200]}" if tool.crashed else "")
            )
    _log(
        f"{len(records)} grounded scenarios from {len(explored.calls)} calls that worked "
        f"({explored.seconds:.1f} s of exploring)"
    )
    if config.generator is not None:
        records = await blend_generated(
            records,
            found.tools,
            config.generator.as_model(),
            config.scenarios,
            context=found.context or None,
            usage=usage,
            seed=config.seed,
            progress=config.progress,
        )
        _log(f"{len(records)} scenarios with the generator's rewordings and tasks")
    return explored, records


async def _rollouts(
    model: TrainableModel,
    config: MCPTrainConfig,
    server: ServerSpec,
    found: Discovery,
    check: Check,
    scenarios: list[InputRecord],
    samples: int,
    description: str,
    after_each: Any = None,
    agent: AgentConfig | None = None,
    evaluation: bool = False,
) -> list[TrajectoryGroup]:
    client = model.openai_client()
    return await gather_trajectory_groups(
        (
            [
                run_agent(
                    model,
                    client,
                    server,
                    s,
                    found.tools,
                    config=agent or config.agent,
                    demonstration=found.demonstration,
                    check=check,
                    evaluation=evaluation,
                )
                for _ in range(samples)
            ]
            for s in scenarios
        ),
        description=description,
        progress=config.progress,
        after_each=after_each,
        max_concurrency=8,
        max_failure_fraction=1.0,
    )


async def _warm_up(
    model: TrainableModel,
    config: MCPTrainConfig,
    found: Discovery,
    train: list[InputRecord],
    epochs: int,
) -> dict[str, Any]:
    """SFT on worked examples, each framed as the agent frames a task: the user's own
    examples (`examples`), then the grounded training scenarios' recorded calls."""
    system: Message = {"role": "system", "content": config.agent.system_prompt}
    # A user's demonstration is blocks of (request, call, result, reply), one per example.
    blocks = [found.demonstration[i : i + 4] for i in range(0, len(found.demonstration), 4)]
    offered = offered_tools(found.tools, config.agent)
    records = [ChatRecord(messages=[system, *block], tools=offered) for block in blocks]
    records += worked_examples(
        train,
        found.tools,
        config.agent.system_prompt,
        result_chars=config.agent.result_chars,
        offered=offered,
        limit=max(config.warmup_examples - len(records), 0),
    )
    # A token is about 3.5 characters of this JSON-heavy text (measured: 434 tokens for
    # the time server's two tools and a short exchange).
    size = max(len(json.dumps([r.model_dump() for r in records[:4]])) / 3.5 / 4, 1.0)
    keep = max(int(config.warmup_tokens / (size * epochs)), 4)
    records = records[:keep]
    if not records:
        raise ConfigError(
            "the SFT warm-up needs worked examples, and there are none (no grounded "
            "scenario with an answer key among the training scenarios, no --examples); "
            "fix: pass --examples, or --warmup-epochs 0"
        )
    sft = {"epochs": epochs, "learning_rate": config.warmup_learning_rate}
    result = await model.train_sft(records, sft)
    stats = result.stats
    _log(
        f"warm-up: SFT on {len(records)} worked examples x {epochs} epochs, "
        f"loss {stats.loss_first:.3f} -> {stats.loss_last:.3f}, serving {model.served_name}"
    )
    return {
        "examples": len(records),
        "epochs": epochs,
        "loss_first": stats.loss_first,
        "loss_last": stats.loss_last,
    }


def _calls_shown(record: InputRecord) -> str:
    """The calls that answer a scenario, as the report shows them (`a(x) -> b(y)`)."""
    raw = record.metadata.get("steps")
    if not isinstance(raw, str):
        return f"{record.metadata.get('tool')} {record.metadata.get('arguments')}"
    return " -> ".join(f"{s['tool']} {json.dumps(s['arguments'])}" for s in json.loads(raw))


def _varied(group: TrajectoryGroup) -> bool:
    """Whether a group's attempts scored differently (else its advantages are all 0)."""
    return len({round(t.reward, 6) for t in group.trajectories}) > 1


async def _reinforce(
    model: TrainableModel,
    config: MCPTrainConfig,
    server: ServerSpec,
    found: Discovery,
    check: Check,
    train: list[InputRecord],
    hook: Any,
    validation: Validation,
    paths: RunPaths,
) -> tuple[list[dict[str, Any]], PipelineRun]:
    """`config.steps` GRPO steps through core's `run_pipeline`, validated on the held-out
    split (keep-best, early stop: `validation`); each batch refilled by dynamic sampling.
    Returns the steps' rows and the run."""
    rows: dict[int, dict[str, Any]] = {}
    steps: list[dict[str, Any]] = []
    batches = iterate_dataset(
        train, config.scenarios_per_step, epochs=1000, seed=config.seed, initial_step=model.step
    )

    async def batch(index: int) -> list[TrajectoryGroup]:
        drawn = next(batches)
        label = f"step {drawn.step + 1 - first}/{config.steps} rollouts"
        sample = partial(_rollouts, model, config, server, found, check)
        groups = await sample(drawn.items, config.group_size, label, hook)
        spare = [r for r in train if r not in drawn.items]
        random.Random(config.seed * 100_003 + drawn.step).shuffle(spare)
        gathered = list(groups)
        for _ in range(config.refill_rounds):
            flat = [g for g in groups if not _varied(g)]
            if not flat or not spare:
                break
            extra, spare = spare[: len(flat)], spare[len(flat) :]
            more = await sample(extra, config.group_size, label, hook)
            gathered += more
            groups = [g for g in groups if _varied(g)] + more
        varied = [g for g in groups if _varied(g)]
        rows[index] = {
            "step": drawn.step + 1,
            **summarize(gathered),
            "groups_varied": len(varied),
            "groups_sampled": len(gathered),
        }
        return varied or groups

    def on_step(step: PipelineStep) -> None:
        row = rows.pop(step.index)
        stats = step.result.stats if step.result is not None else None
        row.update(
            trained=bool(stats and stats.trained),
            loss=stats.loss if stats else None,
            served=model.served_name,
            **({"error": step.error} if step.error else {}),
        )
        steps.append(row)
        append_jsonl(paths.metrics, {"event": "mcp_step", **row})
        _log(
            f"step {row['step']:>3}  reward {row['reward']:.3f}  success "
            f"{row['success']:.3f}  tool errors {row['tool_error_rate']:.3f}  failed "
            f"{row['failed']:.0f}  "
            + (
                f"loss {row['loss']:+.4f}  serving {row['served']}"
                if row["trained"]
                else f"failed: {step.error}"
                if step.error
                else "skipped: equal rewards in every group"
            )
        )

    first = model.step
    run = await run_pipeline(
        model, batch, first + config.steps, on_step=on_step, validation=validation
    )
    if len(run) < config.steps:
        _log(
            f"stopped early after {len(run)} RL steps: held-out success fell below the best "
            f"({run.best_score}, model step {run.best_step}) {config.patience} times"
        )
    if run.restored_from is not None:
        _log(
            f"keeping the best: model step {run.restored_from} is served again as "
            f"{model.served_name}"
        )
    elif config.keep_best and run.best_step == 0 and model.step > 0:
        _log(
            "no trained checkpoint did better than the base model on the held-out split; "
            f"serving the last one ({model.served_name}): see the curve in the report"
        )
    return steps, run


async def train_on_server(
    config: MCPTrainConfig, backend: LocalBackend | None = None, *, check: Check | None = None
) -> dict[str, Any]:
    """Run the whole job (see the module docstring); returns the report.

    With `backend` (already started, e.g. shared by several jobs) the job uses it and
    leaves it running; otherwise it starts one under `config.root` and closes it.
    `check` (a function) takes precedence over `config.check` (an import path).
    """
    started = time.perf_counter()
    if check is None:
        check = load_check(config.check) if config.check else grounded_check
    _log(f"discovering {config.server.label}")
    found = await discover(
        config.server,
        demonstration=config.demonstration or bool(config.examples),
        examples=config.examples,
        allow_unsafe=config.allow_unsafe_tools,
    )
    _log_discovery(config, found)
    model = _new_model(config, found)
    usage = ModelUsage()
    root = backend.root if backend is not None else config.root
    run_dir = RunPaths(root, PROJECT, model.name).dir
    sandbox = run_dir / "sandbox"  # the server's private working directory and home
    server = sandboxed(config.server, sandbox)
    explored, train, held_out = await _split_scenarios(config, found, sandbox, usage)
    judge = config.judge.as_model() if config.judge is not None else None
    hook = None
    if judge is not None:
        from rlcoach.integrations.mcp.reward import ruler_rewards

        hook = ruler_rewards(judge, found.tools, weight=config.judge_weight)
    async with contextlib.AsyncExitStack() as stack:
        if backend is None:
            _log(f"starting the {config.engine} engine with {config.base_model}")
            backend = LocalBackend(config.root, engine={"kind": config.engine})
            await stack.enter_async_context(backend)
        await model.register(backend)
        paths = backend.paths(model)
        _save_inputs(config, found, explored, train, held_out, usage, paths)
        evaluate = _evaluator(model, config, server, found, check, held_out, paths)
        curve = HeldOutCurve(evaluate, model)
        before = await curve.add("before", "before", "before training")
        warmup = None
        epochs = config.warmup_epochs
        if epochs is None:  # auto: only a model that (almost) never succeeds needs it
            epochs = config.auto_warmup_epochs if before["success"] < config.warmup_below else 0
        if epochs and model.step == 0:
            warmup = await _warm_up(model, config, found, train, epochs)
            warmup["eval"] = await curve.add("warmup", "SFT", "after the SFT warm-up")
        curve.first_rl = model.step
        validation = Validation(
            curve.score,
            every=config.eval_every or max(config.steps, 1),
            patience=config.patience,
            keep_best=config.keep_best,
            plateau_stops=False,  # a few held-out tasks tie often; only a fall counts
        )
        steps, run = await _reinforce(
            model, config, server, found, check, train, hook, validation, paths
        )
        # a fresh evaluation even when the curve's last point is this step: the best point
        # is the highest of several noisy ones, and the report's final number should not be
        after = await evaluate(
            "after", "after training" + (" (the best checkpoint)" if run.restored_from else "")
        )
        latest = paths.latest_checkpoint()
    report = _report(
        config, found, explored, train, held_out, check, model, paths, usage, started
    ) | {
        "eval_before": before,
        "warmup": warmup,
        "eval_after": after,
        "steps": steps,
        "held_out_curve": curve.points,
        "best": curve.at(run.best_step),
        "restored_from_step": run.restored_from,
        "stopped_early": len(run) < config.steps,
        "lora": str(latest[1]) if latest else None,
    }
    write_text_atomic(paths.dir / "report.json", json.dumps(report, indent=2) + "\n")
    write_text_atomic(paths.dir / "report.md", report_markdown(report))
    _log(f"report: {paths.dir / 'report.md'}")
    return report


def _new_model(config: MCPTrainConfig, found: Discovery) -> TrainableModel:
    """The model this job trains: named by the config, else by the server and the time."""
    slug = "".join(c if c.isalnum() else "-" for c in found.server_name.lower()).strip("-")
    name = config.name or f"{slug[:40] or 'server'}-{time.strftime('%Y%m%d-%H%M%S')}"
    return TrainableModel(
        name,
        PROJECT,
        base_model=config.base_model,
        config={"learning_rate": config.learning_rate, "seed": config.seed},
    )


def _save_inputs(
    config: MCPTrainConfig,
    found: Discovery,
    explored: Exploration | None,
    train: list[InputRecord],
    held_out: list[InputRecord],
    usage: ModelUsage,
    paths: RunPaths,
) -> None:
    """The exploration and the scenarios, beside the run's checkpoints."""
    if explored is not None:
        write_text_atomic(paths.dir / "exploration.json", explored.model_dump_json(indent=2))
    save_dataset(
        paths.dir / "scenarios",
        train,
        held_out,
        {
            "server": config.server.label,
            "tools": found.tools.names,
            "split": "by call",
            "usage": usage.model_dump(),
            "seed": config.seed,
        },
    )
    _log(f"{len(train)} train and {len(held_out)} held-out scenarios in {paths.dir / 'scenarios'}")


def _log_discovery(config: MCPTrainConfig, found: Discovery) -> None:
    """Say which tools were skipped, called or not (and by which rule), and what else."""
    for name, why in found.tools.skipped:
        _log(f"skipped tool {name}: {why}")
    for verdict in found.safety.values():
        _log(
            f"tool {verdict.name}: "
            + (
                "called"
                if verdict.safe
                else "called: --allow-unsafe-tools"
                if verdict.allowed
                else "NOT called"
            )
            + f" ({verdict.rule})"
        )
    _log(
        f"{len(found.tools.tools)} tools: {', '.join(found.tools.names)}; "
        f"{len(found.resources)} resources, {len(found.prompts)} prompts"
        + (
            f"; a worked example in every prompt: {'yes' if found.demonstration else 'none'}"
            if config.demonstration or config.examples
            else ""
        )
    )
    if problems := found.tools.unforceable():
        _log(f"no forced first call, no strict tools: {'; '.join(problems)}")


async def _split_scenarios(
    config: MCPTrainConfig, found: Discovery, sandbox: Path, usage: ModelUsage
) -> tuple[Exploration | None, list[InputRecord], list[InputRecord]]:
    """(the exploration, train and held-out scenarios), split by the call they need."""
    explored, records = await _scenarios(config, found, sandbox, usage)
    train, held_out = split_by_call(records, config.eval_fraction, config.seed)
    if not train or not held_out:
        raise ConfigError(
            f"{len(records)} scenarios split into {len(train)} train and "
            f"{len(held_out)} held out; both need at least one: give more "
            "scenarios or change eval_fraction"
        )
    return explored, train, held_out


def _evaluator(
    model: TrainableModel,
    config: MCPTrainConfig,
    server: ServerSpec,
    found: Discovery,
    check: Check,
    held_out: list[InputRecord],
    paths: RunPaths,
) -> Any:
    """`evaluate(key, label)`: the served model on the held-out scenarios, its groups kept
    as `eval_<key>.jsonl`, its numbers logged and returned."""

    async def evaluate(key: str, label: str) -> dict[str, float]:
        groups = await _rollouts(
            model,
            config,
            server,
            found,
            check,
            held_out,
            config.eval_samples,
            f"eval {model.served_name}",
            agent=config.agent.model_copy(update={"temperature": config.eval_temperature}),
            evaluation=True,
        )
        save_groups(paths.dir / f"eval_{key}.jsonl", groups)
        result = summarize(groups)
        _log(
            f"held-out {label}: success {result['success']:.3f} reward "
            f"{result['reward']:.3f} tool-call error rate {result['tool_error_rate']:.3f}"
        )
        return result

    return evaluate


def _report(
    config: MCPTrainConfig,
    found: Discovery,
    explored: Exploration | None,
    train: list[InputRecord],
    held_out: list[InputRecord],
    check: Check,
    model: TrainableModel,
    paths: RunPaths,
    usage: ModelUsage,
    started: float,
) -> dict[str, Any]:
    """The report's parts that the run's outcome does not change."""
    return {
        "model": model.name,
        "served": model.served_name,
        "server": config.server.label,
        "server_name": found.server_name,
        "tools": found.tools.names,
        "skipped_tools": [list(s) for s in found.tools.skipped],
        "safety": {n: {"allowed": v.allowed, "rule": v.rule} for n, v in found.safety.items()},
        "exploration": exploration_summary(explored),
        "scenarios": {
            "train": len(train),
            "eval": len(held_out),
            "two_call": sum(_calls_shown(r).count(" -> ") > 0 for r in [*train, *held_out]),
            "source": str(config.scenarios_file)
            if config.scenarios_file
            else "grounded" + (" + generator" if config.generator else ""),
            "examples": [
                {
                    "text": r.text,
                    "tool": r.metadata.get("tool"),
                    "arguments": r.metadata.get("arguments"),
                    "answer_facts": [f.display() for f in answer_facts(r)],
                    "held_out": r in held_out,
                    "calls": _calls_shown(r),
                }
                for r in [*train[:4], *held_out[:4]]
            ],
        },
        "reward": (
            f"{config.judge_weight} x RULER ({config.judge.model}) + "
            f"{1 - config.judge_weight:g} x {getattr(check, '__name__', 'check')}"
            if config.judge
            else getattr(check, "__name__", "check")
        ),
        "generator_usage": usage.model_dump(),
        "minutes": (time.perf_counter() - started) / 60,
        "run_dir": str(paths.dir),
    }
