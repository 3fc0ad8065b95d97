"""`rlcoach mcp train`'s report as Markdown: what a person reads after a run.

The numbers (held-out success and reward before training, after the SFT warm-up and
after GRPO; per step), then what exploring the server did per tool (the safety rule,
calls, usable answers, what errors taught), then a sample of the scenarios with their
answer keys. `report.json` holds the same and more.
"""

from __future__ import annotations

from typing import Any

from rlcoach.integrations.mcp.explore import Exploration

__all__ = ["exploration_summary", "report_markdown"]


def exploration_summary(explored: Exploration | None) -> dict[str, Any] | None:
    """What exploring found, for `report.json` (None without exploration)."""
    if explored is None:
        return None
    return {
        "seconds": round(explored.seconds, 2),
        "sandbox": explored.sandbox,
        "calls_that_worked": len(explored.calls),
        "tools": [t.model_dump() for t in explored.tools],
    }


def report_markdown(report: dict[str, Any]) -> str:
    """`report.md`: the before/after table, the steps, the exploration, sample scenarios."""
    before, after = report["eval_before"], report["eval_after"]
    lines = [
        f"# rlcoach mcp train: {report['model']}",
        "",
        f"- server: `{report['server']}` ({report['server_name']}), tools: "
        f"{', '.join(report['tools'])}",
        f"- scenarios: {report['scenarios']['train']} train, {report['scenarios']['eval']} "
        f"held out ({report['scenarios']['source']}); "
        f"{report['scenarios'].get('two_call', 0)} need two calls",
        f"- reward: {report['reward']}",
        f"- LoRA: `{report['lora']}`",
        f"- minutes: {report['minutes']:.1f}",
        "",
        "| held out | success | reward | tool-call error rate | failed rollouts |",
        "|---|---|---|---|---|",
        f"| before | {before['success']:.3f} | {before['reward']:.3f} | "
        f"{before['tool_error_rate']:.3f} | {before['failed']:.0f} |",
        *(
            [
                f"| after the SFT warm-up | {w['success']:.3f} | {w['reward']:.3f} | "
                f"{w['tool_error_rate']:.3f} | {w['failed']:.0f} |"
            ]
            if (w := (report.get("warmup") or {}).get("eval"))
            else []
        ),
        f"| after | {after['success']:.3f} | {after['reward']:.3f} | "
        f"{after['tool_error_rate']:.3f} | {after['failed']:.0f} |",
        "",
        "| step | reward | success | tool-call error rate | failed | groups varied / sampled "
        "| trained | served |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in report["steps"]:
        lines.append(
            f"| {s['step']} | {s['reward']:.3f} | {s['success']:.3f} | "
            f"{s['tool_error_rate']:.3f} | {s['failed']:.0f} | "
            f"{s.get('groups_varied', '-')} / {s.get('groups_sampled', '-')} | {s['trained']} | "
            f"{s['served']} |"
        )
    lines += _curve_lines(report) + _exploration_lines(report) + _scenario_lines(report)
    return "\n".join(lines) + "\n"


def _curve_lines(report: dict[str, Any]) -> list[str]:
    """The held-out curve (base -> SFT -> RL) and what was served at the end."""
    lines: list[str] = []
    curve = report.get("held_out_curve") or []
    if curve:
        best = report.get("best") or {}
        restored = report.get("restored_from_step")
        lines += [
            "",
            "## Held-out curve (base -> SFT -> RL)",
            "",
            "| model step | after | success | reward | sampled NLL / token | best |",
            "|---|---|---|---|---|---|",
            *(
                f"| {p['step']} | {p['label']} | {p['success']:.3f} | {p['reward']:.3f} | "
                f"{p.get('sampled_nll', 0.0):.3f} | {'yes' if p == best else ''} |"
                for p in curve
            ),
            "",
            f"Served at the end: {report['served']}"
            + (
                f" (model step {restored} restored: the best by held-out success)"
                if restored
                else ""
            )
            + ("; RL stopped early: held-out success fell" if report.get("stopped_early") else ""),
        ]
    return lines


def _exploration_lines(report: dict[str, Any]) -> list[str]:
    """What exploration called, by which rule, and what each tool taught."""
    lines: list[str] = []
    explored = report.get("exploration")
    if explored:
        lines += [
            "",
            f"## Exploration ({explored['seconds']:.1f} s, sandbox `{explored['sandbox']}`)",
            "",
            "| tool | called | rule | calls | usable answers | errors learned from |",
            "|---|---|---|---|---|---|",
        ]
        for t in explored["tools"]:
            lines.append(
                f"| {t['name']} | {'yes' if t['called'] else 'no'} | {t['rule']} | {t['calls']} "
                f"| {t['worked']} | {'; '.join(t['lessons'])[:200] or '-'} |"
            )
    return lines


def _scenario_lines(report: dict[str, Any]) -> list[str]:
    """A sample of the scenarios with their calls and answer keys."""
    lines: list[str] = []
    examples = report["scenarios"].get("examples") or []
    if examples:
        lines += ["", "## Scenarios (a sample; all in scenarios/)", ""]
        lines += ["| request | calls | answer key (facts) | held out |", "|---|---|---|---|"]
        for e in examples:
            lines.append(
                f"| {e['text']} | {e.get('calls') or e['tool'] + ' ' + str(e['arguments'])} | "
                f"{'; '.join(e['answer_facts'])} | {'yes' if e['held_out'] else 'no'} |"
            )
    return lines
