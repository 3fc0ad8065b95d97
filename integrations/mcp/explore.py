"""Exploring a server: call its safe tools with synthesized arguments, keep what works.

    exploration = await explore(spec, tools, safety, sandbox=folder)
    exploration.calls          # GroundedCall: tool, arguments, the real result
    exploration.tools          # per tool: the safety rule, calls made, errors, lessons

The server runs in a private working directory and home (`sandboxed`), so a tool that
writes files writes there. Tools are visited those without required arguments first
(a listing feeds the lookups), in rounds: each round asks the `ArgumentSynthesizer` for
argument sets not yet tried — it knows more each round, from results (`observe`) and
from error messages (`refuse`) — until each tool has `calls_per_tool` calls whose result
has key facts, or `attempts_per_tool` calls were spent, or `budget_s` ran out. Only
tools the safety rule allows are called (`safety.py`).

Calls chain: the values one answer gave (a listing's names, a table's columns, rows)
are the next calls' arguments, and a SQL tool gets SELECTs written from them
(`chaining.py`). Each grounded call keeps the question its query answers (`question`)
and the earlier call whose answer supplied its values (`after`): the material of
multi-step scenarios. A bare listing (`SELECT * FROM t LIMIT 5`) does not count towards
`calls_per_tool`: it is a step towards the questions.

A call that times out stops that tool; a call that kills the server is recorded with the
server's stderr, the server is started again and the tool is not called again. When
nothing worked, `explore` raises the error that says why: every tool unsafe (name the
flag), every answer asking for credentials (name what is missing and `--env`), the
server crashing (its stderr), or the last error of each tool.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rlcoach.autorl.facts import key_facts
from rlcoach.autorl.grounded import GroundedCall, call_key
from rlcoach.errors import ConfigError
from rlcoach.integrations.mcp.chaining import is_sql_property
from rlcoach.integrations.mcp.connection import MCPServerError, ServerSpec, ToolResult, connect
from rlcoach.integrations.mcp.safety import ToolSafety
from rlcoach.integrations.mcp.synthesis import ArgumentSynthesizer
from rlcoach.integrations.mcp.tools import ToolSet

__all__ = ["Exploration", "ToolReport", "explore", "sandboxed", "unsafe_only_message"]

logger = logging.getLogger(__name__)

_CREDENTIALS = re.compile(
    r"api[ _-]?key|access[ _-]?token|\btoken\b|unauthori[sz]ed|\b401\b|\b403\b|forbidden|"
    r"credential|authenticat|not logged in|login required|secret|password",
    re.IGNORECASE,
)
_ERROR_TEXT = re.compile(r"\s*$|[^\n]{0,200}\b(?:error|exception|traceback)\b", re.IGNORECASE)
"""An answer that is empty or an error in words, though not flagged as one (a listing
of files that failed to read, say)."""
_ENV_NAME = re.compile(r"\b[A-Z][A-Z0-9]*_(?:[A-Z0-9]+_)*(?:KEY|TOKEN|SECRET|PASSWORD|ID)\b")


class ToolReport(BaseModel):
    """What exploring did with one tool."""

    model_config = ConfigDict(extra="forbid")

    name: str
    safe: bool
    rule: str
    called: bool
    calls: int = 0
    worked: int = 0
    """Calls whose result had key facts (each a grounded call)."""
    errors: list[str] = Field(default_factory=list)
    """The first few errors, each with the arguments that caused it."""
    lessons: list[str] = Field(default_factory=list)
    crashed: str | None = None


class Exploration(BaseModel):
    """The outcome of `explore`: written to the run folder as `exploration.json`."""

    model_config = ConfigDict(extra="forbid")

    sandbox: str | None
    tools: list[ToolReport]
    calls: list[GroundedCall]
    seconds: float

    def report(self, name: str) -> ToolReport:
        return next(t for t in self.tools if t.name == name)


def sandboxed(spec: ServerSpec, folder: Path) -> ServerSpec:
    """`spec` run with `folder/work` as working directory and `folder/home` as HOME
    (unless the user set them), its command's relative paths made absolute; the package
    caches stay the user's, so `npx`/`uvx` commands do not download again. A URL server
    is returned as it is."""
    if spec.command is None:
        return spec
    work, home = folder / "work", folder / "home"
    work.mkdir(parents=True, exist_ok=True)
    home.mkdir(parents=True, exist_ok=True)
    real_home = Path.home()
    env = {
        "HOME": str(home),
        "XDG_CACHE_HOME": os.environ.get("XDG_CACHE_HOME", str(real_home / ".cache")),
        "NPM_CONFIG_CACHE": os.environ.get("NPM_CONFIG_CACHE", str(real_home / ".npm")),
        **spec.env,
    }
    # The command was written relative to where the user is, not to the sandbox.
    command = [
        os.path.abspath(part) if not os.path.isabs(part) and os.path.exists(part) else part
        for part in spec.command
    ]
    if spec.cwd is not None:
        command = spec.command
    return spec.model_copy(update={"command": command, "cwd": spec.cwd or str(work), "env": env})


def _short(arguments: dict[str, Any]) -> str:
    text = json.dumps(arguments, ensure_ascii=False)
    return text if len(text) <= 120 else text[:117] + "..."


class _Session:
    """One server session that can be started again after a crash."""

    def __init__(self, spec: ServerSpec) -> None:
        self.spec = spec
        self.stack: contextlib.AsyncExitStack | None = None
        self.connection: Any = None

    async def open(self) -> Any:
        if self.connection is None:
            self.stack = contextlib.AsyncExitStack()
            self.connection = await self.stack.enter_async_context(connect(self.spec))
        return self.connection

    async def close(self) -> None:
        if self.stack is not None:
            with contextlib.suppress(Exception):
                await self.stack.aclose()
        self.stack, self.connection = None, None


def _order(tools: ToolSet, allowed: list[str]) -> list[str]:
    """Tools without required arguments first: their answers feed the others."""
    return sorted(allowed, key=lambda n: len(tools.schemas[n].get("required") or []))


def unsafe_only_message(
    spec: ServerSpec, safety: dict[str, ToolSafety], sandbox: Path | None = None
) -> str:
    """The error for a server none of whose tools may be called: each rule, the flag."""
    listed = "; ".join(f"{s.name}: {s.rule}" for s in safety.values())
    where = f" {sandbox}" if sandbox else ""
    return (
        f"every tool of MCP server {spec.label!r} is unsafe to call unattended ({listed}); "
        "exploration and training call none of them. If calling them is acceptable, pass "
        "--allow-unsafe-tools (allow_unsafe=True); the server always runs in a private "
        f"working directory and home{where}"
    )


def _nothing_worked(spec: ServerSpec, reports: list[ToolReport]) -> Exception:
    called = [r for r in reports if r.called]
    crashes = [r for r in called if r.crashed]
    errors = [e for r in called for e in r.errors]
    if called and errors and all(_CREDENTIALS.search(e) for e in errors):
        names = sorted({m for e in errors for m in _ENV_NAME.findall(e)})
        missing = f"the server asks for {', '.join(names)}" if names else "it needs credentials"
        sample = "; ".join(f"{r.name}: {r.errors[0]}" for r in called if r.errors)[:800]
        return ConfigError(
            f"every call to a tool of MCP server {spec.label!r} was refused for want of "
            f"credentials ({sample}): {missing}. Pass them to the server process with "
            "--env NAME=value (stdio), or --header 'Name: value' for a --url server"
        )
    if crashes and len(crashes) == len(called):
        detail = "\n".join(f"{r.name}: {r.crashed}" for r in crashes)
        return MCPServerError(
            f"MCP server {spec.label!r} crashed while being explored; no tool answered:\n{detail}"
        )
    parts = []
    for r in reports:
        if not r.called:
            parts.append(f"{r.name}: not called ({r.rule})")
        elif r.crashed:
            parts.append(f"{r.name}: crashed the server: {r.crashed[:400]}")
        else:
            last = r.errors[-1] if r.errors else "answered nothing with facts in it"
            parts.append(f"{r.name}: {r.calls} calls, last: {last[:300]}")
    return ConfigError(
        f"no call to a tool of MCP server {spec.label!r} gave a usable answer with "
        f"synthesized arguments ({'; '.join(parts)}); give worked examples (--examples) or "
        "scenarios (--scenarios-file), or --allow-unsafe-tools if the tools that were not "
        "called are acceptable to call"
    )


async def explore(
    spec: ServerSpec,
    tools: ToolSet,
    safety: dict[str, ToolSafety],
    *,
    sandbox: Path | None = None,
    calls_per_tool: int = 8,
    attempts_per_tool: int = 24,
    call_timeout_s: float = 15.0,
    budget_s: float = 180.0,
    seed: int = 0,
) -> Exploration:
    """Explore the server (see the module docstring). `safety` maps each tool's policy
    name to its verdict; `sandbox` is the private folder the server runs in."""
    started = time.perf_counter()
    run_spec = sandboxed(spec, sandbox) if sandbox is not None else spec
    synthesizer = ArgumentSynthesizer(seed=seed, hints=list(spec.command or [])[1:])
    reports = {
        name: ToolReport(name=name, safe=s.safe, rule=s.rule, called=s.allowed)
        for name, s in safety.items()
        if name in tools.schemas
    }
    allowed = [name for name, r in reports.items() if r.called]
    if not allowed:
        raise ConfigError(unsafe_only_message(spec, safety, sandbox))
    explorer = _Explorer(run_spec, tools, synthesizer, reports, call_timeout_s)
    try:
        async with asyncio.timeout(budget_s):
            for _round in range(attempts_per_tool):
                if not await explorer.round(allowed, calls_per_tool, attempts_per_tool):
                    break
    except TimeoutError:
        logger.info("exploration stopped at budget_s=%s", budget_s)
    finally:
        await explorer.session.close()
    grounded = explorer.grounded
    exploration = Exploration(
        sandbox=str(sandbox) if sandbox else None,
        tools=list(reports.values()),
        calls=grounded,
        seconds=time.perf_counter() - started,
    )
    if not grounded:
        raise _nothing_worked(spec, exploration.tools)
    return exploration


def _takes_sql(tools: ToolSet, function: dict[str, Any], name: str) -> bool:
    properties = tools.schemas[name].get("properties", {})
    description = function[name].get("description", "")
    return any(is_sql_property(p, s, description) for p, s in properties.items())


def _is_listing(synthesizer: ArgumentSynthesizer, arguments: dict[str, Any]) -> bool:
    """Whether the call ran a SELECT written without a question (a listing, a first step)."""
    return any(
        isinstance(v, str) and v in synthesizer.queries and not synthesizer.queries[v].question
        for v in arguments.values()
    )


async def _try(
    session: _Session, tools: ToolSet, name: str, arguments: dict[str, Any], timeout_s: float
) -> Any:
    """The call's `ToolResult`, or a string saying why the tool must not be called again."""
    try:
        connection = await session.open()
    except MCPServerError as e:
        return f"crash: the server did not start again: {e}"
    try:
        return await connection.call_tool(tools.server_names[name], arguments, timeout_s=timeout_s)
    except TimeoutError:
        await session.close()  # a hung call may hold the session; start a fresh one
        return f"timed out after {timeout_s:g} s with {_short(arguments)}"
    except MCPServerError as e:
        await session.close()
        return f"crash with {_short(arguments)}: {e}"


class _Explorer:
    """One exploration's state: the session, what was tried, what worked and chained."""

    def __init__(
        self,
        spec: ServerSpec,
        tools: ToolSet,
        synthesizer: ArgumentSynthesizer,
        reports: dict[str, ToolReport],
        call_timeout_s: float,
    ) -> None:
        self.tools = tools
        self.synthesizer = synthesizer
        self.reports = reports
        self.call_timeout_s = call_timeout_s
        self.session = _Session(spec)
        self.function = {t["function"]["name"]: t["function"] for t in tools.tools}
        self.grounded: list[GroundedCall] = []
        self.index_of: dict[str, int] = {}  # call key -> its place in `grounded`
        self.tried: set[str] = set()
        self.done: set[str] = set()

    async def round(self, allowed: list[str], calls_per_tool: int, attempts: int) -> bool:
        """A few new calls of each allowed tool; False when no tool had one left."""
        progressed = False
        for name in _order(self.tools, allowed):
            report = self.reports[name]
            # a tool that takes SQL answers any question about the data: it gets twice
            # the calls (the questions are the tasks users write)
            times = 2 if _takes_sql(self.tools, self.function, name) else 1
            if name in self.done or report.worked >= calls_per_tool * times:
                continue
            if report.calls >= attempts * times:
                continue
            for arguments in self._batch(name, calls_per_tool):
                self.tried.add(f"{name}:{json.dumps(arguments, sort_keys=True, default=str)}")
                progressed = True
                outcome = await _try(self.session, self.tools, name, arguments, self.call_timeout_s)
                report.calls += 1
                if isinstance(outcome, str):  # the tool is done: timeout or crash
                    report.errors.append(outcome)
                    report.crashed = outcome if "crash" in outcome[:40] else None
                    self.done.add(name)
                    break
                self._record(name, arguments, outcome, report)
                if report.worked >= calls_per_tool * times:
                    break
        return progressed

    def _batch(self, name: str, calls_per_tool: int) -> list[dict[str, Any]]:
        """Up to four new, schema-valid argument sets for `name`."""
        return [
            a
            for a in self.synthesizer.candidates(
                name,
                self.tools.schemas[name],
                calls_per_tool * 2,
                description=self.function[name].get("description", ""),
            )
            if f"{name}:{json.dumps(a, sort_keys=True, default=str)}" not in self.tried
            and self.tools.check_call(name, a).error is None
        ][:4]

    def _record(
        self, name: str, arguments: dict[str, Any], outcome: ToolResult, report: ToolReport
    ) -> None:
        """What a call that answered taught: an error's lesson, or a grounded call whose
        values later calls may chain from."""
        if outcome.is_error or _ERROR_TEXT.match(outcome.text):
            error = outcome.text.strip()[:300] or "(an empty answer)"
            if len(report.errors) < 5:
                report.errors.append(f"{_short(arguments)} -> {error}")
            lesson = self.synthesizer.refuse(name, arguments, outcome.text)
            if lesson and len(report.lessons) < 5:
                report.lessons.append(lesson)
            return
        key = call_key(name, arguments)
        useful = bool(key_facts(outcome.text, known=json.dumps(arguments)))
        question, after = self.synthesizer.provenance(arguments)  # before observe
        self.synthesizer.observe(
            outcome.text,
            arguments,
            tool=name,
            call=key,
            index=len(self.grounded) if useful else None,
        )
        if not useful:
            if len(report.errors) < 5:
                report.errors.append(f"{_short(arguments)} -> no facts in: {outcome.text[:120]}")
            return
        # a bare listing (`SELECT * FROM t`) is a step towards the questions, not one of
        # them: it does not count as worked
        report.worked += not _is_listing(self.synthesizer, arguments)
        if after in self.index_of:
            logger.info("chained: %s feeds %s", after, key)
        self.index_of[key] = len(self.grounded)
        self.grounded.append(
            GroundedCall(
                tool=name,
                description=self.function[name].get("description", ""),
                parameters=self.tools.schemas[name],
                arguments=arguments,
                result=outcome.text,
                question=question,
                after=self.index_of.get(after) if after else None,
            )
        )
