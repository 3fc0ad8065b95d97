"""What `rlcoach mcp train` learns from a server without a strong model, in its pure
parts: arguments synthesized from schemas (and from the server's errors), the safety
rule per tool, key facts and the grounded reward, grounded scenarios and their split."""

import ast
import json
import operator

from rlcoach.autorl.facts import Fact, facts_score, key_facts
from rlcoach.autorl.gameable import drop_gameable
from rlcoach.autorl.grounded import (
    GroundedCall,
    answer_facts,
    call_key,
    grounded_scenarios,
    split_by_call,
    worked_answer,
)
from rlcoach.integrations.mcp.agent import AgentRun, CallRecord
from rlcoach.integrations.mcp.reward import grounded_check
from rlcoach.integrations.mcp.safety import judge_tool
from rlcoach.integrations.mcp.scenarios import worked_examples
from rlcoach.integrations.mcp.synthesis import ZONES, ArgumentSynthesizer
from rlcoach.integrations.mcp.tools import convert_tools

OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
OPERATORS |= {ast.Div: operator.truediv, ast.Pow: operator.pow}


def evaluate(expression: str) -> float:
    def walk(node):
        if isinstance(node, ast.BinOp):
            return OPERATORS[type(node.op)](walk(node.left), walk(node.right))
        assert isinstance(node, ast.Constant)
        return node.value

    return walk(ast.parse(expression, mode="eval").body)


def test_arguments_come_from_the_schema_names_and_descriptions():
    synth = ArgumentSynthesizer(seed=1)
    zones = synth.candidates("now", {"properties": {"timezone": {"type": "string"}}}, 5)
    assert len(zones) == 5 and all(a["timezone"] in ZONES for a in zones)
    calculator = {"required": ["expression"], "properties": {"expression": {}}}
    sums = synth.candidates("calc", calculator, 4)
    assert len({a["expression"] for a in sums}) == 4
    assert all(isinstance(evaluate(a["expression"]), int | float) for a in sums)
    schema = {
        "type": "object",
        "required": ["when", "unit", "n", "tags", "who", "tz"],
        "properties": {
            "when": {"type": "string", "description": "Time to convert in 24-hour format (HH:MM)"},
            "unit": {"enum": ["celsius", "kelvin"]},
            "n": {"type": "integer", "minimum": 3, "maximum": 5},
            "tags": {"type": "array", "items": {"type": "string", "examples": ["red"]}},
            "who": {"type": "object", "required": ["email"], "properties": {"email": {}}},
            "tz": {"type": "string", "description": "IANA name (e.g., 'Europe/Oslo')"},
            "optional": {"type": "string"},
        },
    }
    [first, second] = synth.candidates("t", schema, 2)
    assert first != second and set(first) == set(schema["required"])
    for arguments in (first, second):
        hour, minute = arguments["when"].split(":")
        assert 0 <= int(hour) < 24 and len(minute) == 2
        assert arguments["unit"] in ("celsius", "kelvin") and 3 <= arguments["n"] <= 5
    assert first["who"] == {"email": "ada@example.com"}  # named: an e-mail address
    assert first["tags"] == ["red"] and first["tz"] == "Europe/Oslo"  # examples first
    assert synth.candidates("none", {"type": "object", "properties": {}}, 3) == [{}]


def test_errors_and_results_teach_the_next_arguments():
    synth = ArgumentSynthesizer(seed=0, hints=["--root", "/srv/notes"])
    schema = {"required": ["city"], "properties": {"city": {"type": "string"}}}
    tried = synth.candidates("lookup", schema, 1)[0]
    error = f"unknown city {tried['city']!r}; known: 'Oslo', 'Quito'"
    lesson = synth.refuse("lookup", tried, error)
    assert lesson is not None and "'Oslo'" in lesson
    retry = synth.candidates("lookup", schema, 3)
    assert retry[0] == {"city": "Oslo"} and tried not in retry  # refused values never return
    # a listing's names feed a later lookup, joined to the folder it listed
    synth.observe("[FILE] plan.md\n[DIR] old", {"path": "/srv/notes"})
    paths = synth.candidates("read", {"required": ["path"], "properties": {"path": {}}}, 4)
    assert {"path": "/srv/notes/plan.md"} in paths and {"path": "/srv/notes"} in paths
    synth.observe(json.dumps([{"id": "ORD-7", "name": "Desk"}]))
    ids = synth.candidates("get", {"required": ["order_id"], "properties": {"order_id": {}}}, 2)
    assert ids[0] == {"order_id": "Desk"} or {"order_id": "ORD-7"} in ids


def test_annotations_rule_and_names_decide_the_rest():
    def verdict(name, description="", annotations=None, **options):
        found = judge_tool(name, description, annotations, **options)
        return found.safe, found.allowed, found.rule

    assert verdict("wipe", "", {"readOnlyHint": True})[:2] == (True, True)  # annotation rules
    assert verdict("get", "", {"readOnlyHint": False, "destructiveHint": False}) == (
        False,
        False,
        "annotated as an additive write (readOnlyHint=false)",
    )
    assert verdict("get", "", {"destructiveHint": True})[2].startswith("annotated as a destr")
    assert verdict("send_invoice")[:2] == (False, False)
    assert "its name says 'send'" in verdict("send_invoice")[2]
    assert "description says 'delete'" in verdict("tidy_cache", "Deletes every cached file.")[2]
    for name, description in [
        ("list_orders", "The orders placed since this server started."),  # 'orders' is a noun here
        ("calculate", "Calculates/evaluates the given expression."),
        ("add", "Add two numbers."),
        ("get_current_time", "Get current time in a specific timezone"),
    ]:
        assert verdict(name, description)[:2] == (True, True), name
    allowed = verdict("drop_table", "", {"destructiveHint": True}, allow_unsafe=True)
    assert allowed == (False, True, "annotated as a destructive write (destructiveHint=true)")


def test_key_facts_are_normalised_numbers_names_and_times():
    result = json.dumps(
        {"timezone": "Asia/Tokyo", "datetime": "2026-12-05T22:21:33+09:00", "day": "Saturday"}
    )
    facts = key_facts(result, known="What time is it in Asia/Tokyo?")
    assert [(f.kind, f.value) for f in facts] == [
        ("time", "22:21"),
        ("date", "2026-12-05"),
        ("text", "Saturday"),
    ]
    assert facts_score(facts, "It is 2026-12-05T22:21:33+09:00 (saturday).") == 1.0
    assert facts_score(facts, "22:21, on a Saturday") == 2 / 3
    assert facts_score([Fact("number", "1,234.0")], "about 1234 of them") == 1.0
    assert facts_score([Fact("number", "19")], "19.5") == 0.0
    assert key_facts("19", known="What is 12 + 7?") == [Fact("number", "19")]
    assert key_facts("12 + 7 = 19", known="What is 12 + 7?") == [Fact("number", "19")]
    assert key_facts('{"entities": [], "relations": []}') == []  # an empty listing says nothing
    assert worked_answer(facts) == "The answer: 2026-12-05T22:21:33+09:00; Saturday."


def grounded_record(tool="lookup", arguments=None, result="Oslo has 709000 inhabitants."):
    call = GroundedCall(
        tool=tool,
        description="The population of a city.",
        parameters={"properties": {"city": {"type": "string"}}},
        arguments=arguments if arguments is not None else {"city": "Oslo"},
        result=result,
    )
    return grounded_scenarios([call], 1)[0]


def test_the_grounded_reward_wants_the_facts_with_credit_for_the_tool():
    record = grounded_record()

    def score(*calls, answer="The answer: 709000."):
        records = [CallRecord(n, json.dumps(a), o, r) for n, a, o, r in calls]
        return grounded_check(AgentRun(record.text, [], records, answer, given=record))

    good = ("lookup", {"city": "Oslo"}, "ok", "Oslo has 709000 inhabitants.")
    assert score(good) == 1.0
    assert score(good, answer="709,000 people") == 1.0  # numbers by value
    assert score(good, answer="Many people.") == 0.4  # right tool, valid call, no facts
    assert score(("lookup", {"town": 1}, "rejected", "bad"), answer="?") == 0.2
    assert score(("other", {}, "ok", "x"), answer="?") == 0.0
    assert score(answer="709000") == 0.6  # the facts without the tool
    # the same call answering differently now (a clock, a live count): its answer counts
    live = ("lookup", {"city": "oslo "}, "ok", "Oslo has 710000 inhabitants.")
    assert score(live, answer="710000") == 1.0 and score(live, answer="709000") == 0.4
    # a scenario with no answer key is scored by the server-agnostic check
    plain = type(record)(text="Anything about Oslo?")
    run = AgentRun(plain.text, [], [CallRecord("lookup", "{}", "ok")], "done", given=plain)
    assert grounded_check(run) == 1.0


def test_grounded_scenarios_keep_values_verbatim_and_split_by_call():
    calls = [
        GroundedCall(
            tool="convert_time",
            description="Convert time between timezones.",
            parameters={"properties": {"source_timezone": {}, "time": {}}},
            arguments={"source_timezone": zone, "time": "14:00"},
            result=json.dumps({"target": {"datetime": f"2026-12-05T{hour}:00:00Z"}}),
        )
        for zone, hour in [("Asia/Tokyo", "05"), ("Europe/Oslo", "13"), ("Africa/Cairo", "12")]
    ]
    records = grounded_scenarios(calls, 30)
    assert len(records) == 15 and len({r.text for r in records}) == 15  # 5 wordings each
    for record in records:
        arguments = json.loads(record.metadata["arguments"])
        assert all(value in record.text for value in arguments.values())
        facts = answer_facts(record)
        assert facts and not any(f.value == "14:00" for f in facts)  # not the request's
    assert records[0].text.startswith("Convert time between timezones for source timezone")
    train, held_out = split_by_call(records, 0.34, seed=0)
    assert train and held_out
    assert not {r.metadata["call"] for r in train} & {r.metadata["call"] for r in held_out}
    tools = convert_tools(
        [{"name": "convert_time", "inputSchema": {"type": "object", "properties": {}}}]
    )
    [example] = worked_examples(train[:1], tools, "Be brief.")
    system, user, call, answer, reply = example.messages
    assert user["content"] == train[0].text and system["content"] == "Be brief."
    assert call["tool_calls"][0]["function"]["arguments"] == train[0].metadata["arguments"]
    assert answer["content"] == train[0].metadata["answer_key"]
    assert reply["content"].startswith("The answer: 2026-12-05T")


def test_the_whole_tool_is_read_what_is_run_decides():
    def verdict(name, description, annotations=None):
        found = judge_tool(name, description, annotations)
        return found.safe, found.rule

    safe, rule = verdict("read_query", "Execute a SELECT query on the SQLite database")
    assert safe and "'execute' runs a read" in rule and "'select'" in rule
    assert verdict("query", "Runs a read-only SQL query.")[0]
    assert verdict("search_logs", "Executes a search over the logs.")[0]
    for name, description in [
        ("sql", "Execute an INSERT, UPDATE, or DELETE query"),  # what it runs writes
        ("run_command", "Run a shell command"),  # runs something not shown to read
        ("evaluate", "Execute JavaScript in the page"),
        ("read_and_wipe", "Read a record."),  # the name writes: the description cannot undo it
        # Any SQL, and a word that only begins like a read ("readable") proves nothing.
        ("execute_query", "Execute a SQL query and return results in a readable format."),
        ("exec", "Executes the given listener script."),
    ]:
        assert not verdict(name, description)[0], name
    assert "it reads ('list')" in verdict("list_tables", "List all tables")[1]
    # words inside a path are no words of the text (mcp-alchemy names its database file)
    listing = "Return all table names. Connected to sqlite database /srv/runs/exec/shop.db."
    assert verdict("all_table_names", listing)[0]
    assert verdict("wipe", "Execute anything", {"readOnlyHint": True})[0]  # annotations rule


def test_a_listing_feeds_a_two_call_task_that_names_the_item_by_its_place():
    listing = GroundedCall(
        tool="list_directory",
        description="List the contents of a directory.",
        parameters={"properties": {"path": {"type": "string"}}},
        arguments={"path": "/srv/notes"},
        result="[FILE] plan.md\n[FILE] todo.md\n[DIR] old",
    )
    read = GroundedCall(
        tool="read_file",
        description="Read a file.",
        parameters={"properties": {"path": {"type": "string"}}},
        arguments={"path": "/srv/notes/todo.md"},
        result="Buy 3 lamps before Friday and call Ada Lovelace.",
        after=0,
    )
    records = grounded_scenarios([listing, read], 10)
    multi = [r for r in records if r.metadata["source"] == "grounded, two calls"]
    assert len(multi) == 3 and len(records) > len(multi)
    for record in multi:
        assert "second" in record.text and "/srv/notes" in record.text
        assert "todo.md" not in record.text  # found by the first call, not given
    [example] = worked_examples(
        multi[:1],
        convert_tools(
            [
                {"name": n, "inputSchema": {"type": "object", "properties": {"path": {}}}}
                for n in ("list_directory", "read_file")
            ]
        ),
        "Be brief.",
    )
    calls = [m["tool_calls"][0]["function"] for m in example.messages if m.get("tool_calls")]
    assert [c["name"] for c in calls] == ["list_directory", "read_file"]
    assert json.loads(calls[1]["arguments"]) == {"path": "/srv/notes/todo.md"}
    results = [m["content"] for m in example.messages if m["role"] == "tool"]
    assert results == [listing.result, read.result]


def test_trivial_replies_must_score_below_a_fifth():
    calls = [
        GroundedCall(tool="flag", arguments={"name": n}, result=json.dumps({"on": v}))
        for n, v in (("alpha", 1), ("beta", 0), ("gamma", 1))
    ]
    calls.append(GroundedCall(tool="who", arguments={"id": "7"}, result='{"name": "Ada Lovelace"}'))
    rejected = []
    records = grounded_scenarios(calls, 20, rejected=rejected)
    assert records and all(r.metadata["tool"] == "who" for r in records)
    assert rejected and {g.record.metadata["tool"] for g in rejected} == {"flag"}
    assert all(g.score >= 0.2 for g in rejected)
    kept, gamed = drop_gameable(records)
    assert kept == records and not gamed


def test_values_come_first_from_a_tool_about_the_same_thing():
    synth = ArgumentSynthesizer()
    listing = call_key("list_tables", {})
    synth.observe('[{"name": "authors"}, {"name": "books"}]', {}, tool="list_tables", call=listing)
    rows = '[{"id": 1, "name": "Kenji Sato", "city": "Osaka"}]'
    query = {"query": "SELECT * FROM customers"}
    synth.observe(rows, query, tool="read_query", call=call_key("read_query", query))
    schema = {"required": ["table_name"], "properties": {"table_name": {"type": "string"}}}
    first, second = synth.candidates("describe_table", schema, 2)
    assert {first["table_name"], second["table_name"]} == {"authors", "books"}
    assert synth.provenance(first) == ("", listing)  # the listing supplied it
