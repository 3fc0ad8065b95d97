"""`rlcoach report <run dir>`: one static HTML page for people with neither Langfuse nor W&B.

It reads only the disk record of a run (`metrics.jsonl`, `trajectories/<step>.jsonl`,
`run.json`) and writes `report.html` in the run folder, atomically, as one self-contained
file (the charts are PNGs from matplotlib, embedded), so it can be mailed or archived.

The page: reward (mean ± std, min and max) and success curves per step — computed from
the trajectory files, so skipped steps and runs older than the metrics' reward columns
show too; the evaluations `model.log` recorded (`<split>/reward` per step and split,
chart and table); a per-step table (rewards, failures, loss, KL, grad norm, the
sampler/trainer mismatch, tokens, timings, sink errors) and a chart of the mismatch; and
for each step a sample of trajectories (the best and the worst of each group), each with
its reward and advantage, metadata, the judge's explanation and logs, its tool calls, and
its token sequences exactly as the trainer sees them (the same `build_sequences`): context
tokens plain, sampled — trained — tokens highlighted, tokens a sampling constraint forced
(sampled, not trained) struck through in grey, decoded one by one with the base model's
tokenizer. Without a tokenizer the messages are shown, sampled replies highlighted.
"""

from __future__ import annotations

import base64
import html
import io
import json
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlcoach.errors import ConfigError
from rlcoach.paths import write_text_atomic
from rlcoach.trajectory.histories import content_text
from rlcoach.trajectory.timeline import timeline
from rlcoach.trajectory.trajectories import Trajectory, TrajectoryGroup, load_groups

__all__ = ["RunRecord", "read_run", "write_report"]

logger = logging.getLogger(__name__)

_TRAJECTORY_FILE = re.compile(r"([0-9]+)(?:-skip([0-9]+))?\.jsonl")


@dataclass
class RunRecord:
    """What the disk holds about one run."""

    dir: Path
    info: dict[str, Any]
    metrics: list[dict[str, Any]]
    steps: dict[tuple[int, int], list[TrajectoryGroup]]
    """Groups by (step, skip): skip 0 is what the step trained on, k > 0 its k-th attempt
    that trained nothing (`<step>-skip<k>.jsonl`)."""
    unreadable_lines: int = 0
    """Lines of metrics.jsonl that are not JSON (torn by a crash); skipped."""


def read_run(folder: str | os.PathLike[str]) -> RunRecord:
    """Load a run folder (`<root>/<project>/<model>/`)."""
    path = Path(folder)
    metrics_file, trajectories = path / "metrics.jsonl", path / "trajectories"
    if not metrics_file.is_file() and not trajectories.is_dir():
        raise ConfigError(
            f"{str(path)!r} is not a run folder: it has neither metrics.jsonl nor "
            "trajectories/; fix: pass <root>/<project>/<model>, e.g. .rlcoach/my-project/agent"
        )
    info = {}
    if (path / "run.json").is_file():
        info = json.loads((path / "run.json").read_text())
    metrics, unreadable = [], 0
    if metrics_file.is_file():
        for line in metrics_file.read_text().splitlines():
            if line.strip():
                try:
                    metrics.append(json.loads(line))
                except (ValueError, RecursionError):
                    unreadable += 1
    steps = {}
    if trajectories.is_dir():
        for file in sorted(trajectories.glob("*.jsonl")):
            if match := _TRAJECTORY_FILE.fullmatch(file.name):
                steps[(int(match[1]), int(match[2] or 0))] = load_groups(file)
    return RunRecord(path, info, metrics, steps, unreadable)


# -- numbers ---------------------------------------------------------------------------


def _stats(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    mean = sum(values) / len(values)
    std = (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5
    return {"mean": mean, "std": std, "min": min(values), "max": max(values)}


def _in_order(key: tuple[int, int]) -> tuple[int, bool, int]:
    """(step, skip) in the order things happened: a step's skipped attempts, then it."""
    step, skip = key
    return step, skip == 0, skip


def _step_rows(run: RunRecord) -> list[dict[str, Any]]:
    """One row per step: rewards from the trajectories, the rest from the last record."""
    records: dict[tuple[int, int], dict[str, Any]] = {}
    for record in run.metrics:
        if record.get("event") in ("train", "skipped") and isinstance(record.get("step"), int):
            skip = record.get("skip", 0)
            step = record["step"]
            if record["event"] == "skipped" and "skip" not in record:
                # Written before skipped attempts had files of their own: the record holds
                # the step it failed to advance, and its groups went to the next step's file.
                step, skip = step + 1, 0
            records[(step, skip if isinstance(skip, int) else 0)] = record
    rows = []
    for key in sorted(set(run.steps) | set(records), key=_in_order):
        step, skip = key
        trajectories = [t for g in run.steps.get(key, []) for t in g.trajectories]
        rewards = _stats([t.reward for t in trajectories])
        success = [t.metrics["success"] for t in trajectories if "success" in t.metrics]
        record = records.get(key, {})
        rows.append(
            {
                "step": step,
                "label": f"{step} (skip {skip})" if skip else str(step),
                "event": record.get("event", "skipped" if skip else "-"),
                "rewards": rewards,
                "success": sum(success) / len(success) if success else None,
                "rollouts": len(trajectories),
                "failures": sum(len(g.failures) for g in run.steps.get(key, [])),
                "record": record,
            }
        )
    return rows


# -- charts ----------------------------------------------------------------------------


def _png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode()


def _finished(
    name: str,
    figure: Any,
    axes: Any,
    title: str,
    xlabel: str = "training step",
    legend: bool = True,
) -> tuple[str, str]:
    """A chart's common finish (title, step axis, grid, legend) as (name, PNG base64); the
    figure is closed."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    axes.set_xlabel(xlabel)
    axes.set_title(title)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.grid(alpha=0.3)
    if legend:
        axes.legend(fontsize=8)
    png = _png(figure)
    plt.close(figure)
    return name, png


def _eval_records(run: RunRecord) -> list[dict[str, Any]]:
    """The `model.log` records: event `eval`, a split, a step and its mean reward."""
    return [
        r
        for r in run.metrics
        if r.get("event") == "eval"
        and isinstance(r.get("split"), str)
        and isinstance(r.get("step"), int)
        and isinstance(r.get(f"{r['split']}/reward"), int | float)
    ]


def _charts(
    rows: list[dict[str, Any]], evals: list[dict[str, Any]] | None = None
) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    charts = []
    scored = [r for r in rows if r["rewards"]]
    if scored:
        steps = [r["step"] for r in scored]
        mean = [r["rewards"]["mean"] for r in scored]
        std = [r["rewards"]["std"] for r in scored]
        figure, axes = plt.subplots(figsize=(6.4, 3.4))
        axes.fill_between(
            steps,
            [m - s for m, s in zip(mean, std, strict=True)],
            [m + s for m, s in zip(mean, std, strict=True)],
            alpha=0.2,
            label="± std",
        )
        axes.plot(steps, mean, marker="o", label="mean reward")
        axes.plot(steps, [r["rewards"]["max"] for r in scored], ls=":", label="max")
        axes.plot(steps, [r["rewards"]["min"] for r in scored], ls=":", label="min")
        axes.set_ylabel("reward")
        charts.append(
            _finished("Reward", figure, axes, "Reward per step (rollouts the step trained on)")
        )
    succeeded = [r for r in rows if r["success"] is not None]
    if succeeded:
        figure, axes = plt.subplots(figsize=(6.4, 3.4))
        axes.plot(
            [r["step"] for r in succeeded],
            [r["success"] for r in succeeded],
            marker="o",
            color="tab:green",
        )
        axes.set_ylim(-0.05, 1.05)
        axes.set_ylabel("success rate")
        title = "Success per step (metrics['success'])"
        charts.append(_finished("Success", figure, axes, title, legend=False))
    if evals:
        figure, axes = plt.subplots(figsize=(6.4, 3.4))
        for split in sorted({e["split"] for e in evals}):
            points = [(e["step"], e[f"{split}/reward"]) for e in evals if e["split"] == split]
            axes.plot(*zip(*points, strict=True), marker="s", label=f"{split}/reward")
        axes.set_ylabel("mean reward")
        xlabel = "training step (checkpoint evaluated)"
        charts.append(_finished("Evaluations", figure, axes, "Evaluations (model.log)", xlabel))
    measured = [r for r in rows if "mismatch_abs_mean" in r["record"]]
    if measured:
        steps = [r["step"] for r in measured]
        figure, axes = plt.subplots(figsize=(6.4, 3.4))
        for key, label in (
            ("mismatch_abs_mean", "mean |Δ log-prob|"),
            ("mismatch_kl_k3", "KL(sampler‖trainer), k3"),
            ("mismatch_beyond_fraction", "share of tokens beyond the threshold"),
        ):
            axes.plot(steps, [r["record"].get(key) for r in measured], marker="o", label=label)
        title = "Sampler/trainer mismatch on the trained tokens"
        charts.append(_finished("Mismatch", figure, axes, title))
    return charts


# -- tokens ----------------------------------------------------------------------------


def _tokenizer(run: RunRecord, override: str | os.PathLike[str] | None) -> Any:
    """The base model's tokenizer, or None when it cannot be found here."""
    source: Any = override
    if source is None:
        base = run.info.get("base_model")
        if not base:
            return None
        try:
            from rlcoach.models.base_model import resolve_base_model

            source = resolve_base_model(base)
        except Exception as e:
            logger.warning("no tokenizer for %r (%s); showing messages instead", base, e)
            return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(source))
    except Exception as e:
        logger.warning("could not load a tokenizer from %s (%s); showing messages", source, e)
        return None


def _token_html(trajectory: Trajectory, tokenizer: Any, advantage: float) -> str:
    from rlcoach.trainer.sequences import build_sequences

    try:  # forced tokens kept in view (train_forced), told apart by their forced mask
        sequences = build_sequences(trajectory, advantage, train_forced=True)
    except Exception as e:  # a trajectory with nothing sampled
        return f'<p class="note">no sampled tokens ({html.escape(str(e)[:200])})</p>'
    parts = []
    for number, sequence in enumerate(sequences):
        pieces = []
        forced_mask = sequence.forced_mask or [0] * len(sequence.token_ids)
        for token, sampled, forced in zip(
            sequence.token_ids, sequence.sampled_mask, forced_mask, strict=True
        ):
            text = html.escape(tokenizer.decode([token]))
            if forced:
                pieces.append(f'<span class="f">{text}</span>')
            else:
                pieces.append(f'<span class="t">{text}</span>' if sampled else text)
        forced_count = sum(forced_mask)
        trained = sequence.sampled_tokens - forced_count
        note = f", {forced_count} forced (not trained)" if forced_count else ""
        parts.append(
            f'<div class="seq-head">sequence {number + 1}: {len(sequence.token_ids)} '
            f"tokens, {trained} trained{note}</div>"
            f'<pre class="tokens">{"".join(pieces)}</pre>'
        )
    return "".join(parts)


def _message_html(trajectory: Trajectory) -> str:
    sampled = {
        json.dumps(c.message, sort_keys=True) for h in trajectory.histories() for c in h.choices
    }
    parts = []
    for message in trajectory.messages:
        text = content_text(message.get("content"))
        for call in message.get("tool_calls") or []:
            function = call.get("function", call)
            text += f"\n→ {function.get('name')}({function.get('arguments')})"
        css = "msg t" if json.dumps(message, sort_keys=True) in sampled else "msg"
        role = html.escape(str(message.get("role")))
        parts.append(f'<div class="{css}"><b>{role}</b> {html.escape(text)}</div>')
    return "".join(parts)


# -- page ------------------------------------------------------------------------------


def _num(value: Any, digits: int = 3) -> str:
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value)
    if isinstance(value, int | float):
        return f"{value:.{digits}f}" if isinstance(value, float) else str(value)
    return html.escape(str(value))


def _table(rows: list[dict[str, Any]]) -> str:
    head = (
        "step",
        "event",
        "reward mean",
        "± std",
        "success",
        "rollouts",
        "failed",
        "loss",
        "KL",
        "grad norm",
        "mismatch |Δ| mean/max",
        "mismatch KL",
        "beyond",
        "tokens trained/total",
        "train s",
        "step s",
        "publish ms",
        "sink errors",
    )
    body = []
    for row in rows:
        r, record = row["rewards"], row["record"]
        errors = sum(v for k, v in record.items() if k.startswith("sink_errors/"))
        tokens = (
            f"{record['sampled_tokens']}/{record['total_tokens']}"
            if "sampled_tokens" in record
            else "-"
        )
        publish = record.get("publish_seconds")
        mismatch = (
            f"{record['mismatch_abs_mean']:.4f}/{record['mismatch_abs_max']:.3f}"
            if "mismatch_abs_mean" in record
            else None
        )
        cells = [
            (row["label"], 0),
            (row["event"], 0),
            (r.get("mean"), 3),
            (r.get("std"), 3),
            (row["success"], 3),
            (row["rollouts"], 0),
            (row["failures"], 0),
            (record.get("loss"), 4),
            (record.get("kl"), 4),
            (record.get("grad_norm"), 3),
            (mismatch, 0),
            (record.get("mismatch_kl_k3"), 5),
            (record.get("mismatch_beyond_fraction"), 3),
            (tokens, 0),
            (record.get("seconds"), 1),
            (record.get("step_seconds"), 1),
            (publish * 1000 if publish else None, 0),
            (errors if record else None, 0),
        ]
        body.append("<tr>" + "".join(f"<td>{_num(c, d)}</td>" for c, d in cells) + "</tr>")
    return (
        "<table class='steps'><tr>"
        + "".join(f"<th>{h}</th>" for h in head)
        + "</tr>"
        + "".join(body)
        + "</table>"
    )


def _eval_table(evals: list[dict[str, Any]]) -> str:
    if not evals:
        return ""
    body = []
    for record in evals:
        split = record["split"]
        others = ", ".join(
            f"{html.escape(k.removeprefix(split + '/'))}={_num(v)}"
            for k, v in sorted(record.items())
            if k.startswith(split + "/")
            and k.split("/", 1)[1] not in {"reward", "reward_std", "rollouts", "rollout_failures"}
        )
        cells = [
            _num(record["step"]),
            html.escape(split),
            _num(record.get(f"{split}/reward")),
            _num(record.get(f"{split}/reward_std")),
            _num(record.get(f"{split}/rollouts"), 0),
            _num(record.get(f"{split}/rollout_failures"), 0),
            others or "-",
        ]
        body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    head = ("step", "split", "reward mean", "± std", "rollouts", "failed", "other metrics")
    return (
        "<h2>Evaluations</h2><table class='steps'><tr>"
        + "".join(f"<th>{h}</th>" for h in head)
        + "</tr>"
        + "".join(body)
        + "</table>"
    )


def _sample(groups: list[TrajectoryGroup], per_step: int) -> list[tuple[int, float, Trajectory]]:
    """The best and the worst attempt of each group, until `per_step` are chosen."""
    chosen: list[tuple[int, float, Trajectory]] = []
    for number, group in enumerate(groups):
        if not group.trajectories:
            continue
        mean = sum(group.rewards) / len(group.rewards)
        ranked = sorted(group.trajectories, key=lambda t: t.reward, reverse=True)
        for trajectory in {id(t): t for t in (ranked[0], ranked[-1])}.values():
            if len(chosen) < per_step:
                chosen.append((number, mean, trajectory))
    return chosen


def _trajectory_html(
    number: int, mean: float, trajectory: Trajectory, tokenizer: Any, opened: bool = False
) -> str:
    advantage = trajectory.reward - mean
    judge = [verdict.describe() for verdict in trajectory.verdicts]
    other = trajectory.logs  # older run folders hold the judge's lines here
    line = timeline(trajectory)
    calls = "".join(
        f"<li class='{'err' if c.error else ''}'><code>{html.escape(c.name)}"
        f"({html.escape(json.dumps(c.arguments)[:300])})</code> → "
        f"{html.escape((c.result or '(no answer)')[:300])}</li>"
        for c in line.tool_calls
    )
    meta = ", ".join(
        f"{html.escape(str(k))}={html.escape(str(v))}" for k, v in trajectory.metadata.items()
    )
    metrics = ", ".join(f"{html.escape(k)}={v:.3g}" for k, v in trajectory.metrics.items())
    summary = (
        f"group {number} · reward <b>{trajectory.reward:.3f}</b> · advantage "
        f"{advantage:+.3f} · {html.escape(', '.join(trajectory.policy_versions))}"
        + (f" · {meta}" if meta else "")
    )
    body = [
        f"<p class='kv'>metrics: {metrics or '-'}<br>"
        f"id: <code>{html.escape(trajectory.id)}</code></p>"
    ]
    if judge:
        body.append(
            "<div class='judge'><b>Judge</b>"
            + "".join(f"<p>{html.escape(j)}</p>" for j in judge)
            + "</div>"
        )
    if other:
        body.append(
            "<div class='logs'><b>Logs</b>"
            + "".join(f"<p>{html.escape(o)}</p>" for o in other)
            + "</div>"
        )
    if calls:
        body.append(f"<div><b>Tool calls</b><ul>{calls}</ul></div>")
    if advantage == 0:
        body.append("<p class='note'>advantage 0: these tokens got no gradient</p>")
    body.append(
        _token_html(trajectory, tokenizer, advantage)
        if tokenizer is not None
        else _message_html(trajectory)
    )
    state = " open" if opened else ""
    return f"<details class='traj'{state}><summary>{summary}</summary>{''.join(body)}</details>"


_STYLE = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px;margin-bottom:4px} h2{font-size:18px;margin-top:28px}
.sub{color:#666;font-size:13px} .charts img{max-width:48%;margin-right:1%}
table.steps{border-collapse:collapse;font-size:12px} .steps td,.steps th{border:1px solid #ddd;
padding:3px 6px;text-align:right} .steps th{background:#f4f4f4}
details.traj{border:1px solid #ddd;border-radius:6px;margin:6px 0;padding:4px 8px}
details.traj summary{cursor:pointer;font-size:13px}
pre.tokens{white-space:pre-wrap;font-size:12px;background:#fafafa;padding:8px;border-radius:4px}
span.t{background:#ffe58a;border-bottom:2px solid #e0a800}
span.f{color:#999;background:#eee;text-decoration:line-through}
.msg{font-size:12px;white-space:pre-wrap;margin:2px 0;padding:2px 4px}.msg.t{background:#ffe58a}
.judge{background:#eef6ff;padding:4px 8px;border-radius:4px;font-size:13px}
.logs{font-size:12px;color:#444} li.err{color:#b00} .note{color:#888;font-size:12px}
.seq-head{font-size:11px;color:#666;margin-top:6px} .legend span.t{padding:0 4px}
.kv,details.traj ul{font-size:12px} details.traj b{font-size:13px}
"""


def _page(
    run: RunRecord,
    rows: list[dict[str, Any]],
    charts: list[tuple[str, str]],
    steps_html: str,
    evals_html: str = "",
) -> str:
    title = f"{run.info.get('project', run.dir.parent.name)}/{run.info.get('model', run.dir.name)}"
    trained = sum(1 for r in rows if r["event"] == "train")
    skipped = sum(1 for r in rows if r["event"] == "skipped")
    last = next((r["rewards"]["mean"] for r in reversed(rows) if r["rewards"]), None)
    first = next((r["rewards"]["mean"] for r in rows if r["rewards"]), None)
    images = "".join(
        f"<img alt='{name}' src='data:image/png;base64,{data}'>" for name, data in charts
    )
    # The script marks the page once every chart has decoded, for a headless check.
    return f"""<!doctype html><html><head><meta charset="utf-8">
<title>rlcoach report · {html.escape(title)}</title><style>{_STYLE}</style></head>
<body><h1>rlcoach report · {html.escape(title)}</h1>
<p class="sub">base model {html.escape(str(run.info.get("base_model", "?")))} · {trained} steps
trained, {skipped} skipped · mean reward {_num(first)} at the first step → {_num(last)} at the
last · run folder <code>{html.escape(str(run.dir))}</code></p>
<div class="charts">{images or "<p class='note'>no rewards recorded yet</p>"}</div>
<h2>Steps</h2>{_table(rows)}
{evals_html}
<h2>Trajectories</h2><p class="legend sub">The best and the worst attempt of each group.
Token view: <span class="t">highlighted</span> tokens were sampled by the policy and are the
ones trained on (weighted by the advantage); <span class="f">struck-through</span> tokens were
forced by a sampling constraint (a JSON schema, a forced tool call) and are not trained; the
rest is context. The mismatch columns compare the trainer's log-probs of the trained tokens
with the sampler's (vLLM's) at the weights that sampled them.</p>
{steps_html}
<script>window.addEventListener("load",()=>{{const i=[...document.images];
document.body.dataset.charts=i.filter(x=>x.complete&&x.naturalWidth>0).length;}});</script>
</body></html>"""


def write_report(
    folder: str | os.PathLike[str],
    *,
    samples_per_step: int = 4,
    tokenizer: str | os.PathLike[str] | None = None,
    output: str | os.PathLike[str] | None = None,
) -> Path:
    """Render `report.html` for the run in `folder` (atomically); return its path."""
    if samples_per_step < 0:
        raise ConfigError(f"samples_per_step={samples_per_step} must be 0 or more")
    run = read_run(folder)
    rows = _step_rows(run)
    loaded = _tokenizer(run, tokenizer) if samples_per_step and run.steps else None
    sections: list[str] = []
    for (step, skip), groups in sorted(run.steps.items(), key=lambda item: _in_order(item[0])):
        chosen = _sample(groups, samples_per_step)
        if chosen:  # the very first trajectory opens, so the page shows one at once
            title = f"Step {step}" + (f" (skipped attempt {skip}: nothing trained)" if skip else "")
            sections.append(
                f"<h3>{title}</h3>"
                + "".join(
                    _trajectory_html(n, mean, t, loaded, opened=not sections and k == 0)
                    for k, (n, mean, t) in enumerate(chosen)
                )
            )
    evals = _eval_records(run)
    page = _page(run, rows, _charts(rows, evals), "".join(sections), _eval_table(evals))
    return write_text_atomic(Path(output) if output else run.dir / "report.html", page)
