"""Reading a SQL server as a user would, on real MCP server subprocesses over stdio: the
published `mcp-server-sqlite` (PyPI, in its own environment with `mcp<2`: `make`
installs it under `.venv/servers/sqlite`) and `mcp_sql_server.py` (the same tools
written with the official SDK 2.x, answering JSON), both serving the bookshop of
`examples/mcp_servers/shop.sql`. No policy is involved: the safety reading, the chained
exploration, the scenarios and the trivial-reply check need none."""

import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from mcp_servers import make_repo  # bench/: the repository the benchmark serves

from rlcoach.autorl.gameable import GENERIC, drop_gameable
from rlcoach.autorl.grounded import answer_facts, grounded_scenarios, worked_answer
from rlcoach.errors import ConfigError
from rlcoach.integrations.mcp import ServerSpec
from rlcoach.integrations.mcp.agent import AgentRun, CallRecord
from rlcoach.integrations.mcp.discovery import discover
from rlcoach.integrations.mcp.explore import explore
from rlcoach.integrations.mcp.reward import grounded_check
from rlcoach.integrations.mcp.scenarios import server_scenarios

ROOT = Path(__file__).resolve().parents[2]
SQLITE = ROOT / ".venv" / "servers" / "sqlite" / "bin" / "mcp-server-sqlite"
OURS = Path(__file__).with_name("mcp_sql_server.py")
EXPLORE_SERVER = Path(__file__).with_name("mcp_explore_server.py")
ANY_SQL = Path(__file__).with_name("mcp_any_sql_server.py")
GIT = ROOT / ".venv" / "servers" / "git" / "bin" / "mcp-server-git"
WRITERS = ("write_query", "create_table", "append_insight")


def shop(folder: Path) -> Path:
    database = folder / "shop.db"
    with sqlite3.connect(database) as connection:
        connection.executescript((ROOT / "examples" / "mcp_servers" / "shop.sql").read_text())
    return database


def servers(folder: Path) -> dict[str, ServerSpec]:
    database = shop(folder)
    return {
        "mcp-server-sqlite": ServerSpec(command=[str(SQLITE), "--db-path", str(database)]),
        "sdk": ServerSpec(command=[sys.executable, str(OURS), str(database)]),
    }


@pytest.fixture(scope="module", params=["mcp-server-sqlite", "sdk"])
async def explored(request, tmp_path_factory):
    """(discovery, exploration, sandbox) of one of the two SQL servers."""
    folder = tmp_path_factory.mktemp(request.param)
    spec = servers(folder)[request.param]
    found = await discover(spec, demonstration=False)
    sandbox = folder / "sandbox"
    result = await explore(
        spec, found.tools, found.safety, sandbox=sandbox, calls_per_tool=6, budget_s=120
    )
    return found, result, sandbox


async def test_the_whole_tool_is_read_execute_a_select_is_a_read(explored):
    found, result, sandbox = explored
    rules = {name: (v.allowed, v.rule) for name, v in found.safety.items()}
    assert rules["read_query"][0] is True, rules["read_query"]
    assert "'execute' runs a read" in rules["read_query"][1]
    assert "'select'" in rules["read_query"][1]
    assert rules["list_tables"][0] and rules["describe_table"][0]
    assert rules["write_query"] == (False, "unannotated; its name says 'write'")
    assert rules["create_table"] == (False, "unannotated; its name says 'create'")
    assert rules["append_insight"] == (False, "unannotated; its name says 'append'")
    assert sorted(found.tools.names) == ["describe_table", "list_tables", "read_query"]
    assert {t.name for t in result.tools if t.called} == set(found.tools.names)
    assert not list((sandbox / "work").glob("*.called"))  # no writer ran (ours marks them)
    assert all(c.tool not in WRITERS for c in result.calls)


async def test_answers_become_the_next_calls_arguments(explored):
    _, result, _ = explored
    calls = result.calls
    listing = next(i for i, c in enumerate(calls) if c.tool == "list_tables")
    tables = {"authors", "books", "customers", "orders"}
    described = {c.arguments["table_name"] for c in calls if c.tool == "describe_table"}
    assert described and described <= tables  # the listing's names, not guesses
    chained = [c for c in calls if c.tool == "describe_table" and c.after is not None]
    assert chained and all(c.after == listing for c in chained)
    queries = [c for c in calls if c.tool == "read_query"]
    assert all(q.arguments["query"].upper().startswith("SELECT") for q in queries)
    questions = [q for q in queries if q.question]
    assert len(questions) >= 4
    for query in questions:  # each ran on real values and answered with real data
        sql = query.arguments["query"]
        assert " WHERE " in sql or " ORDER BY " in sql or "COUNT(" in sql
        assert "error" not in query.result.lower() and query.result.strip() not in ("[]", "")
    two_step = [q for q in questions if q.after is not None]
    assert two_step, [q.question for q in questions]
    for query in two_step:  # the later query uses the value the earlier one returned
        first = calls[query.after]
        assert first.tool == "read_query" and query.after < calls.index(query)
        linked = query.arguments["query"].rsplit("=", 1)[1].strip().strip("'")
        assert linked in first.result
        assert not re.search(rf"\b{re.escape(linked)}\b", query.question)  # not given away


async def test_tasks_are_questions_and_chains_whose_keys_no_trivial_reply_earns(explored):
    _, result, _ = explored
    rejected = []
    records = grounded_scenarios(result.calls, 32, rejected=rejected)
    assert len(records) >= 12
    multi = [r for r in records if r.metadata["source"] == "grounded, two calls"]
    assert len(multi) * 3 >= len(records)  # at least a third need two calls
    assert any("SELECT" not in r.text and r.text.endswith("?") for r in records)
    assert not any("SELECT" in r.text for r in records)  # users ask, they write no SQL
    assert len({r.text.split(":")[0] for r in records}) >= 4  # varied wording
    by_call = {}
    for record in records:
        by_call.setdefault(record.metadata["call"], record)
        facts = answer_facts(record)
        assert facts and all(f.value not in ("0", "1") for f in facts)
        steps = json.loads(record.metadata["steps"])
        assert len(steps) == (2 if record in multi else 1)
    # the reward of a reply without a tool: trivial replies score below 0.2, the right
    # facts 0.6, and the recorded calls with the right facts 1.0
    for record in records:
        others = [worked_answer(answer_facts(r)) for c, r in by_call.items() if c != record.id]
        others = [a for a in others if a != worked_answer(answer_facts(record))]
        for reply in ["", record.text, GENERIC, *others[:8]]:
            run = AgentRun(record.text, [], [], reply, given=record)
            assert grounded_check(run) < 0.2, (record.text, reply)
        right = worked_answer(answer_facts(record))
        assert grounded_check(AgentRun(record.text, [], [], right, given=record)) == 0.6
        steps = json.loads(record.metadata["steps"])
        made = [CallRecord(s["tool"], json.dumps(s["arguments"]), "ok", s["result"]) for s in steps]
        assert grounded_check(AgentRun(record.text, [], made, right, given=record)) == 1.0
    kept, gamed = drop_gameable(records)
    assert kept == records and not gamed
    assert all(g.score >= 0.2 for g in rejected)


async def test_a_server_whose_answers_only_trivial_replies_match_is_refused(tmp_path):
    spec = ServerSpec(command=[sys.executable, str(EXPLORE_SERVER), "flags"])
    found = await discover(spec, demonstration=False)
    with pytest.raises(ConfigError) as refused:
        await server_scenarios(spec, found.tools, found.safety, 16, sandbox=tmp_path, budget_s=60)
    message = str(refused.value)
    assert "trivial-reply check" in message and "feature_enabled" in message
    assert "--scenarios-file" in message and "--generator-url" in message


async def test_a_tool_that_runs_any_sql_is_explored_and_offered_only_for_reads(tmp_path):
    """`execute_query` runs whatever it gets: exploring it sends only SELECTs, a policy's
    write is answered with the reason and never reaches the database, and the user can
    lift the guard (`allow_unsafe`)."""
    database = shop(tmp_path)
    spec = ServerSpec(command=[sys.executable, str(ANY_SQL), str(database)])
    found = await discover(spec, demonstration=False)
    verdict = found.safety["execute_query"]
    assert verdict.allowed and verdict.guard == "query", verdict
    assert "only statements that read are let through" in verdict.rule
    result = await explore(
        spec, found.tools, found.safety, sandbox=tmp_path / "sandbox", calls_per_tool=4, budget_s=60
    )
    queries = [c.arguments["query"] for c in result.calls if c.tool == "execute_query"]
    assert queries and all(re.match(r"\s*SELECT\b", q, re.IGNORECASE) for q in queries), queries
    before = _counts(database)
    for statement in [
        "DELETE FROM books",
        "SELECT 1; DROP TABLE books",
        "UPDATE books SET price = 0",
    ]:
        checked = found.tools.check_call("execute_query", {"query": statement})
        assert (checked.arguments is None and "is not a read" in checked.error) or (
            "several statements" in checked.error
        ), checked
    assert (
        found.tools.check_call("execute_query", {"query": "SELECT title FROM books"}).error is None
    )
    assert _counts(database) == before
    unguarded = await discover(spec, demonstration=False, allow_unsafe=True)
    assert unguarded.safety["execute_query"].guard is None and not unguarded.tools.guards


def _counts(database: Path) -> dict[str, int]:
    with sqlite3.connect(database) as connection:
        tables = [
            r[0] for r in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")
        ]
        return {t: connection.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in tables}


async def test_a_git_server_is_read_from_its_text_answers(tmp_path):
    """The published `mcp-server-git` (its own environment under `.venv/servers/git`) on a
    small repository: its annotated read-only tools are explored with the repository of
    its launch command kept while the other arguments vary, the log's text records become
    questions about one commit and two-call tasks (the log, then a commit by its place),
    and no tool that writes runs."""
    repo = tmp_path / "repo"
    make_repo(repo)
    before = _git_state(repo)
    spec = ServerSpec(command=[str(GIT), "--repository", str(repo)])
    found = await discover(spec, demonstration=False)
    readers = {"git_status", "git_diff_unstaged", "git_diff_staged", "git_diff", "git_log"}
    assert {n for n, s in found.safety.items() if s.allowed} == readers | {"git_show", "git_branch"}
    explored, records = await server_scenarios(
        spec, found.tools, found.safety, 32, sandbox=tmp_path / "sandbox", budget_s=90
    )
    assert explored.calls and all(c.arguments["repo_path"] == str(repo) for c in explored.calls)
    assert len({c.arguments["revision"] for c in explored.calls if c.tool == "git_show"}) >= 3
    asked = [r for r in records if "tell me: what is" in r.text]
    assert asked and all(str(repo) in r.text for r in asked), [r.text for r in records]
    chained = [
        json.loads(r.metadata["steps"])
        for r in records
        if r.metadata["source"] == "grounded, two calls"
    ]
    assert any([s["tool"] for s in steps] == ["git_log", "git_show"] for steps in chained)
    assert len(chained) * 3 >= len(records), len(chained)  # a third or more need two calls
    assert _git_state(repo) == before


def _git_state(repo: Path) -> tuple[str, str]:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True).stdout

    return git("rev-parse", "main", "release"), git("status", "--porcelain")
