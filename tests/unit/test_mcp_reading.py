"""Reading a server's text answers and guarding a tool that runs any SQL, in their pure
parts: records in `Key: value` answers (a repository's log), questions about one record,
two-call tasks that state the first call's own values, exploration that varies one
argument of a call that worked at a time, and the read-only guard."""

import json

import pytest

from rlcoach.autorl.facts import keyed_records, listed_items
from rlcoach.autorl.grounded import GroundedCall, grounded_scenarios
from rlcoach.integrations.mcp.safety import judge_tool
from rlcoach.integrations.mcp.sql_guard import read_only_sql_error
from rlcoach.integrations.mcp.synthesis import ArgumentSynthesizer, keyed_strings_in
from rlcoach.integrations.mcp.tools import convert_tools

LOG = """Commit history:
Commit: 5ca6170b4d90f839b80eaffbd8966cf56de5b1c6
Author: Grace Hopper
Date: 2026-12-07 10:41:41+00:00
Message: Note the tea


Commit: fe7f1f2865562b67e2bdab4fd6da0c772a167144
Author: Ada Lovelace
Date: 2026-12-06 09:12:00+00:00
Message: Add the first notes
"""
REPO = {"repo_path": {"type": "string"}}


def test_a_text_log_is_read_as_records_with_named_fields():
    assert keyed_records(LOG)[1] == {
        "Commit": "fe7f1f2865562b67e2bdab4fd6da0c772a167144",
        "Author": "Ada Lovelace",
        "Date": "2026-12-06 09:12:00+00:00",
        "Message": "Add the first notes",
    }
    rows = "1. row\nname: Dune\nprice: 9.5\n\n2. row\nname: Emma\nprice: 7\n\nResult: 2 rows"
    assert [r["name"] for r in keyed_records(rows)] == ["Dune", "Emma"]  # not the summary
    grid = (
        '{"range": "A1:B3", "values": [["Name", "Office"], ["Ines", "Leeds"], ["Omar", "Cairo"]]}'
    )
    assert keyed_records(grid) == [
        {"Name": "Ines", "Office": "Leeds"},
        {"Name": "Omar", "Office": "Cairo"},
    ]
    assert listed_items(LOG)[0][:2] == ["5ca6170b4d90f839b80eaffbd8966cf56de5b1c6", "Grace Hopper"]
    assert keyed_records('[{"title": "Dune", "price": 9.5}]') == [{"title": "Dune", "price": "9.5"}]
    assert {("Author", "Grace Hopper"), ("Message", "Add the first notes")} <= set(
        keyed_strings_in(LOG)
    )
    assert ("", "release") in keyed_strings_in("* master\n  release")  # a bare listing


def test_a_listing_of_records_gives_questions_about_one_record_and_chains_by_place():
    log = GroundedCall(
        tool="git_log",
        description="Shows the commit logs.",
        parameters={"properties": REPO},
        arguments={"repo_path": "/srv/repo"},
        result=LOG,
    )
    show = GroundedCall(
        tool="git_show",
        description="Shows the contents of a commit.",
        parameters={"properties": {**REPO, "revision": {"type": "string"}}},
        arguments={
            "repo_path": "/srv/repo",
            "revision": "fe7f1f2865562b67e2bdab4fd6da0c772a167144",
        },
        result="commit fe7f1f2\nAuthor: Ada Lovelace\n\n    Add the first notes\n+Buy 3 lamps",
        after=0,
    )
    records = grounded_scenarios([log, show], 20)
    asked = [r for r in records if "tell me: what is" in r.text]
    assert asked, [r.text for r in records]
    first = asked[0]
    # the record is named by a value no other record has; the fact asked is its field
    assert "/srv/repo" in first.text and 'whose author is "Ada Lovelace"' in first.text
    assert {f[1] for f in json.loads(first.metadata["facts"])} == {"2026-12-06", "09:12"}
    chained = [r for r in records if r.metadata["source"] == "grounded, two calls"]
    assert chained and all("/srv/repo" in r.text and "second" in r.text for r in chained)
    assert all("fe7f1f2" not in r.text for r in chained)  # found by the first call


def test_no_request_needs_what_the_agent_is_not_shown_of_a_cut_result():
    """A log of six commits cut at `result_chars` shows the agent the first three or so:
    the grounded writer reads the same cut text, so no two-call task points at a commit
    past the cut (nor says "last": the agent cannot see the listing's end), and no
    question asks about a record past it (before, the writer read the whole result)."""
    people = [
        "Grace Hopper",
        "Ada Lovelace",
        "Alan Turing",
        "Edsger Dijkstra",
        "Barbara Liskov",
        "Donald Knuth",
    ]
    hashes = [f"{i:x}" * 40 for i in range(10, 16)]
    log = "Commit history:\n" + "".join(
        f"Commit: {h}\nAuthor: {who}\nDate: 2026-11-0{i + 1} 10:00:00+00:00\n"
        f"Message: Note number {i + 1} by {who.split()[0]}\n\n\n"
        for i, (h, who) in enumerate(zip(hashes, people, strict=True))
    )
    limit = log.index(hashes[3]) + 10  # the agent sees three commits and a piece of the 4th

    def show(index: int) -> GroundedCall:
        return GroundedCall(
            tool="git_show",
            description="Shows the contents of a commit.",
            parameters={"properties": {**REPO, "revision": {"type": "string"}}},
            arguments={"repo_path": "/srv/repo", "revision": hashes[index]},
            result=f"commit {hashes[index]}\nAuthor: {people[index]}\n\n    Change {index}"
            f"\n+Buy {index + 3} lamps",
            after=0,
        )

    first = GroundedCall(
        tool="git_log",
        description="Shows the commit logs.",
        parameters={"properties": REPO},
        arguments={"repo_path": "/srv/repo"},
        result=log,
    )
    records = grounded_scenarios([first, show(1), show(5)], 40, result_chars=limit)
    chained = [r for r in records if r.metadata["source"] == "grounded, two calls"]
    assert chained and all(hashes[1] in r.metadata["arguments"] for r in chained)
    assert not any("last" in r.text for r in chained)
    asked = [r for r in records if "tell me: what is" in r.text]
    assert asked and not any(who in r.text for r in asked for who in people[3:])
    # shown whole, the sixth commit is the last one listed
    whole = grounded_scenarios([first, show(1), show(5)], 40, result_chars=len(log))
    assert any(
        "last" in r.text and hashes[5] in r.metadata["arguments"]
        for r in whole
        if r.metadata["source"] == "grounded, two calls"
    )


def test_a_call_that_worked_is_varied_one_argument_at_a_time():
    synth = ArgumentSynthesizer(seed=0, hints=["--repository", "/srv/repo"])
    schema = {
        "properties": {**REPO, "target": {"type": "string"}},
        "required": ["repo_path", "target"],
    }
    synth.observe(LOG, {"repo_path": "/srv/repo"}, tool="git_log", call="git_log:{}")
    synth.observe(
        "Diff with master:", {"repo_path": "/srv/repo", "target": "master"}, tool="git_diff"
    )
    # a failure of a varied call blames the new value, never the one that worked
    synth.refuse("git_diff", {"repo_path": "/srv/repo", "target": "nope"}, "unknown ref")
    batch = synth.candidates("git_diff", schema, 4)
    # the last property first, from the ids the log showed, the scope kept
    assert [(a["repo_path"], a["target"][:7]) for a in batch[:2]] == [
        ("/srv/repo", "fe7f1f2"),
        ("/srv/repo", "5ca6170"),
    ], batch
    assert "/srv/repo" not in synth.refused.get("git_diff.repo_path", [])


@pytest.mark.parametrize(
    ("statement", "why"),
    [
        ("SELECT title FROM books WHERE note = 'drop table x';", None),
        ("WITH cheap AS (SELECT * FROM books WHERE price < 9) SELECT count(*) FROM cheap", None),
        ("select replace(name, 'a', 'b') from authors order by name desc", None),
        ("PRAGMA table_info(books)", None),
        ("DELETE FROM books", "starts with DELETE"),
        ("SELECT 1; DROP TABLE books", "several statements"),
        ("WITH d AS (DELETE FROM books RETURNING *) SELECT * FROM d", "says DELETE"),
        ("SELECT * INTO copy FROM books", "says INTO"),
        ("PRAGMA journal_mode = WAL", "says ="),
        ("SELECT load_extension('x.so')", "says LOAD_EXTENSION"),
        ("/* hi */ ", "holds no statement"),
        (7, "not an SQL statement"),
    ],
)
def test_the_read_only_guard_lets_through_one_read(statement, why):
    problem = read_only_sql_error(statement)
    assert problem is None if why is None else why in problem, problem


def test_a_tool_that_runs_any_sql_is_guarded_not_refused():
    schema = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
    description = "Execute a SQL query and return results in a readable format."
    verdict = judge_tool("execute_query", description, schema=schema)
    assert verdict.safe and verdict.guard == "query"
    assert "only statements that read are let through" in verdict.rule
    assert not judge_tool("execute_query", description).allowed  # no SQL property: unsafe
    lifted = judge_tool("execute_query", description, schema=schema, allow_unsafe=True)
    assert lifted.allowed and lifted.guard is None
    tools = convert_tools(
        [{"name": "execute_query", "description": description, "inputSchema": schema}]
    )
    tools.guards = {"execute_query": "query"}
    refused = tools.only(["execute_query"]).check_call("execute_query", '{"query": "DROP TABLE t"}')
    assert refused.arguments is None and "execute_query refused query" in refused.error
    assert tools.check_call("execute_query", {"query": "SELECT 1"}).error is None


def test_a_value_many_records_share_is_no_answer_key():
    """Questions about one column's type: another table's "TEXT" answers it too, so it
    is dropped as gameable (the whole result holding TEXT does not excuse it)."""

    def schema(table: str, rows: list[tuple[str, str]]) -> GroundedCall:
        return GroundedCall(
            tool="describe_table",
            description="Get the schema information for a specific table",
            parameters={"properties": {"table_name": {"type": "string"}}},
            arguments={"table_name": table},
            result=json.dumps([{"name": n, "type": t} for n, t in rows]),
        )

    calls = [
        schema("books", [("id", "INTEGER"), ("title", "TEXT"), ("price", "REAL")]),
        schema("authors", [("id", "INTEGER"), ("name", "TEXT"), ("born", "DATE")]),
    ]
    asked = [r for r in grounded_scenarios(calls, 20) if "tell me: what is" in r.text]
    answers = {json.loads(r.metadata["facts"])[0][1] for r in asked}
    assert "TEXT" not in answers and answers, [r.text for r in asked]
