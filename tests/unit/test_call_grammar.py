"""The forced-call grammar (call_grammar.py) and the schema check before it
(schema_support.py): what each family's grammar accepts and refuses, checked with
xgrammar itself (the grammar engine vLLM runs), and how the calls are read back."""

import json

import pytest

from rlcoach.endpoint.call_grammar import forced_call, with_tool_calls
from rlcoach.endpoint.constraint import unknown_tool_problem
from rlcoach.endpoint.schema_support import check_tool_schema
from rlcoach.errors import ConfigError, ToolSchemaError

xgrammar = pytest.importorskip("xgrammar")
from xgrammar.testing import _is_grammar_accept_string as accepts  # noqa: E402


def tool(name, properties, required=(), **extra):
    parameters = {"type": "object", "properties": properties, "required": list(required)}
    return {"type": "function", "function": {"name": name, "parameters": parameters, **extra}}


ADD = tool("add", {"a": {"type": "integer"}, "b": {"type": "integer"}}, ["a", "b"])
FIND = tool(
    "find",
    {
        "q": {"type": "string"},
        "exact": {"type": "boolean"},
        "where": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Lisbon", "Oslo"]}},
            "required": ["city"],
        },
    },
)
REQUIRED = {"tools": [ADD, FIND], "tool_choice": "required"}
NAMED = {"tools": [ADD, FIND], "tool_choice": {"type": "function", "function": {"name": "add"}}}


def grammar(body, parser):
    forced = forced_call(body, parser)
    return forced, xgrammar.Grammar.from_structural_tag(json.dumps(forced.structural_tag()))


HERMES_ADD = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
HERMES_FIND = (
    '<tool_call>\n{"name": "find", "arguments": {"where": {"city": "Oslo"}}}\n</tool_call>'
)


@pytest.mark.parametrize(
    ("parser", "body", "text", "expected"),
    [
        ("hermes", REQUIRED, HERMES_ADD, True),
        ("hermes", REQUIRED, HERMES_ADD + "\n" + HERMES_FIND, True),
        (
            "hermes",
            REQUIRED,
            '<tool_call>\n{"name": "add", "arguments": {"a":2,"b":3}}\n</tool_call>',
            True,
        ),
        ("hermes", REQUIRED, "", False),  # required: at least one call
        ("hermes", REQUIRED, "Sure! " + HERMES_ADD, False),  # nothing but calls
        ("hermes", REQUIRED, HERMES_ADD.replace(', "b": 3', ""), False),  # b is required
        ("hermes", REQUIRED, HERMES_ADD.replace("3}", '3, "c": 1}'), False),  # no other keys
        ("hermes", REQUIRED, HERMES_ADD.replace("2", '"2"'), False),  # an integer
        ("hermes", REQUIRED, HERMES_ADD.replace(": 2", ":   2"), False),  # whitespace runs
        ("hermes", REQUIRED, HERMES_FIND.replace("Oslo", "Paris"), False),  # the enum
        ("hermes", NAMED, HERMES_ADD, True),
        ("hermes", NAMED, HERMES_FIND, False),  # the named tool only
        ("hermes", NAMED, HERMES_ADD + "\n" + HERMES_ADD, False),  # one call
        ("pythonic", REQUIRED, "[add(a=2, b=3)]", True),
        ("pythonic", REQUIRED, "[find()]", True),
        ("pythonic", REQUIRED, '[find(exact=True, where={"city": "Lisbon"})]', True),
        ("pythonic", REQUIRED, '[add(a=1, b=2), find(q="x")]', True),
        ("pythonic", REQUIRED, "[]", False),
        ("pythonic", REQUIRED, "[add(a=2)]", False),
        ("pythonic", REQUIRED, "[find(exact=true)]", False),  # Python's True, as rendered
        ("pythonic", NAMED, "[find()]", False),
        ("llama3_json", REQUIRED, '{"name": "add", "parameters": {"a": 2, "b": 3}}', True),
        ("llama3_json", REQUIRED, '{"name": "add", "parameters": {"a": 2}}', False),
    ],
)
def test_the_grammar_allows_the_family_envelope_around_fitting_arguments(
    parser, body, text, expected
):
    _, compiled = grammar(body, parser)
    assert accepts(compiled, text) is expected


def test_calls_are_read_back_as_sampled():
    forced = forced_call(REQUIRED, "hermes")
    calls = forced.tool_calls(HERMES_ADD.replace("3}", "3 }") + "\n" + HERMES_FIND)
    assert [c["function"]["name"] for c in calls] == ["add", "find"]
    # the arguments as written, so a returned call re-renders to the sampled text
    assert calls[0]["function"]["arguments"] == '{"a": 2, "b": 3 }'
    assert calls[0]["id"].startswith("call_") and calls[0]["id"] != calls[1]["id"]
    pythonic = forced_call(REQUIRED, "pythonic").tool_calls(
        '[find(exact=False, where={"city": "Oslo"}), add(a=-1, b=2)]'
    )
    assert [json.loads(c["function"]["arguments"]) for c in pythonic] == [
        {"exact": False, "where": {"city": "Oslo"}},
        {"a": -1, "b": 2},
    ]
    assert forced.tool_calls('<tool_call>\n{"name": "add", "arguments": {"a": 2') == []
    # cut by max_tokens in its second call, a reply still made its first
    cut = forced.tool_calls(HERMES_ADD + '\n<tool_call>\n{"name": "find", "arguments": {"q')
    assert [c["function"]["name"] for c in cut] == ["add"]
    cut = forced_call(REQUIRED, "pythonic").tool_calls('[add(a=1, b=2), find(q="x)')
    assert [c["function"]["arguments"] for c in cut] == ['{"a": 1, "b": 2}']


def test_a_reply_becomes_tool_calls_as_openai_answers_them():
    choice = {"message": {"role": "assistant", "content": HERMES_ADD}, "finish_reason": "stop"}
    required = forced_call(REQUIRED, "hermes")
    answered = with_tool_calls(choice, required, required.tool_calls(HERMES_ADD))
    assert answered["message"]["content"] is None
    assert answered["message"]["tool_calls"][0]["function"]["name"] == "add"
    assert answered["finish_reason"] == "tool_calls"
    named = forced_call(NAMED, "hermes")
    assert with_tool_calls(choice, named, named.tool_calls(HERMES_ADD))["finish_reason"] == "stop"
    cut = {"message": {"content": HERMES_ADD[:30]}, "finish_reason": "length"}
    assert with_tool_calls(cut, required, required.tool_calls(HERMES_ADD[:30])) == cut
    longer = {"message": {"content": HERMES_ADD + "\n<tool"}, "finish_reason": "length"}
    answered = with_tool_calls(longer, required, required.tool_calls(HERMES_ADD + "\n<tool"))
    assert answered["finish_reason"] == "length" and answered["message"]["tool_calls"]


def test_the_engine_is_asked_with_the_grammar_and_no_tool_choice_of_its_own():
    upstream = forced_call(NAMED, "hermes").upstream(
        {**NAMED, "response_format": {"type": "json_object"}}
    )
    assert upstream["tool_choice"] == "none" and upstream["tools"] == NAMED["tools"]
    assert "response_format" not in upstream
    tag = json.loads(upstream["structured_outputs"]["structural_tag"])
    assert tag["type"] == "structural_tag"
    assert tag["format"]["begin"] == '<tool_call>\n{"name": "add", "arguments": '


def test_free_requests_and_unknown_envelopes_get_no_grammar():
    assert forced_call({"tools": [ADD]}, "hermes") is None
    assert forced_call({"tools": [ADD], "tool_choice": "auto"}, "hermes") is None
    strict = {**ADD, "function": {**ADD["function"], "strict": True}}
    assert forced_call({"tools": [strict]}, "pythonic") is None  # `[` opens prose too
    assert forced_call(REQUIRED, "mistral") is None  # vLLM's own handling
    assert forced_call(REQUIRED, None) is None
    assert forced_call({"tool_choice": "required"}, "hermes") is None


def test_a_tool_choice_naming_a_tool_not_offered_is_refused():
    problem = unknown_tool_problem(
        {"tools": [ADD], "tool_choice": {"type": "function", "function": {"name": "mul"}}}
    )
    assert "'mul'" in problem and "'add'" in problem and "fix:" in problem
    assert unknown_tool_problem(NAMED) is None
    assert unknown_tool_problem(REQUIRED) is None


RECURSIVE = {
    "type": "object",
    "properties": {"tree": {"$ref": "#/$defs/Node"}},
    "$defs": {
        "Node": {
            "type": "object",
            "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
        }
    },
}


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        (RECURSIVE, "$ref"),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}}, "$ref"),
        ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "not"),
        (
            {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 3}}},
            "multipleOf",
        ),
        (
            {"type": "object", "properties": {"t": {"type": "array", "uniqueItems": True}}},
            "uniqueItems",
        ),
        ({"type": "object", "if": {"required": ["a"]}, "then": {}}, "if"),
        ({"type": "object", "properties": {"s": {"format": "phone"}}}, "format"),
    ],
)
def test_a_schema_the_grammar_cannot_hold_names_the_tool_and_keyword(schema, keyword):
    with pytest.raises(ToolSchemaError) as info:
        check_tool_schema("plan_trip", schema)
    assert isinstance(info.value, ConfigError | ValueError)
    message = str(info.value)
    assert "'plan_trip'" in message and f"`{keyword}`" in message and "fix:" in message
    assert info.value.tool == "plan_trip" and info.value.keyword == keyword
    body = {"tools": [tool("plan_trip", {})], "tool_choice": "required"}
    body["tools"][0]["function"]["parameters"] = schema
    with pytest.raises(ToolSchemaError):
        forced_call(body, "hermes")


def test_schemas_the_grammar_holds_pass():
    shared = {
        "type": "object",
        "properties": {"home": {"$ref": "#/$defs/Place"}, "work": {"$ref": "#/$defs/Place"}},
        "$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string"}}}},
    }
    for schema in (ADD["function"]["parameters"], FIND["function"]["parameters"], shared, None):
        check_tool_schema("ok", schema)
    body = {"tools": [tool("ok", {})], "tool_choice": "required"}
    body["tools"][0]["function"]["parameters"] = shared
    _, compiled = grammar(body, "pythonic")
    assert accepts(compiled, '[ok(home={"city": "Oslo"}, work={"city": "Rome"})]')


STRICT_ADD = {**ADD, "function": {**ADD["function"], "strict": True}}
AUTO = {"tools": [STRICT_ADD, FIND]}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is 5.", True),  # free text: the model need not call
        ("Let me add. " + HERMES_ADD, True),  # text, then a call held to the schema
        (HERMES_ADD.replace(', "b": 3', ""), False),  # a strict call that misses `b`
        (HERMES_ADD.replace("2", '"2"'), False),
        ('<tool_call>\n{"name": "find", "arguments": {"anything": [1]}}\n</tool_call>', True),
    ],
)
def test_strict_tools_without_a_forced_choice_hold_the_calls_the_model_makes(text, expected):
    forced, compiled = grammar(AUTO, "hermes")
    assert forced.auto and forced.named is None
    assert accepts(compiled, text) is expected


def test_a_strict_call_keeps_the_text_before_it():
    forced = forced_call(AUTO, "hermes", 200)
    text = "Let me add. " + HERMES_ADD
    choice = {"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
    answered = with_tool_calls(choice, forced, forced.tool_calls(text))
    assert answered["message"]["content"] == "Let me add."
    assert answered["finish_reason"] == "tool_calls"
    free = {"message": {"role": "assistant", "content": "5"}, "finish_reason": "stop"}
    assert with_tool_calls(free, forced, forced.tool_calls("5")) == free


def test_a_second_constraint_beside_the_call_grammar_is_named_not_merged():
    """The engine holds a reply to one grammar: a request's own constraint beside a forced
    call (or strict tools) is refused by name; options and a moot response_format pass."""
    choice = {"structured_outputs": {"choice": ["yes", "no"]}}
    problem = forced_call({**REQUIRED, **choice}, "hermes").conflict({**REQUIRED, **choice})
    assert "tool_choice='required'" in problem and "structured_outputs.choice" in problem
    assert "fix: drop structured_outputs.choice" in problem
    named = {**NAMED, "guided_regex": "a+"}
    assert "guided_regex" in forced_call(named, "hermes").conflict(named)
    strict = {**ADD, "function": {**ADD["function"], "strict": True}}
    json_text = {"tools": [strict], "response_format": {"type": "json_object"}}
    assert "strict tools" in forced_call(json_text, "hermes").conflict(json_text)
    # A forced reply is calls only: its response_format is moot; options are no constraint.
    quiet = {
        **REQUIRED,
        "response_format": {"type": "json_object"},
        "structured_outputs": {"disable_any_whitespace": True},
    }
    call = forced_call(quiet, "hermes")
    assert call.conflict(quiet) is None
    assert call.upstream(quiet)["structured_outputs"]["disable_any_whitespace"] is True
