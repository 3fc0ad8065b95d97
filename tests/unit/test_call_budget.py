"""A forced call always closes within its token budget (call_budget.py): the grammar the
endpoint builds, walked token by token with the shipped models' real tokenizers by an
adversary that never wants to stop — at each step it takes an allowed token of the fewest
bytes, never the end of turn while anything else is allowed — ends with the end of turn
inside `max_tokens`, and what it wrote reads back as calls that fit their schemas."""

import json
import random

import jsonschema
import numpy as np
import pytest
from tool_schemas import SCHEMAS, TOOLS, tool

from rlcoach.endpoint.call_budget import bounded_schema, worst_bytes
from rlcoach.endpoint.call_grammar import forced_call

xgrammar = pytest.importorskip("xgrammar")


@pytest.fixture(scope="module", params=["smollm2-135m-instruct", "gemma3-270m"])
def engine_side(request):
    """(a grammar compiler, each token's bytes, the end-of-turn ids) for a shipped model."""
    from transformers import AutoTokenizer

    from rlcoach.models.bundled import shipped_model_path

    tokenizer = AutoTokenizer.from_pretrained(shipped_model_path(request.param))
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer)
    sizes = np.array([len(piece) for piece in info.decoded_vocab], dtype=np.int64)
    compiler = xgrammar.GrammarCompiler(info)
    return compiler, info.decoded_vocab, sizes, set(info.stop_token_ids), request.param


def walk(engine_side, tag, budget: int, seed: int) -> tuple[bytes, int, bool]:
    """The adversary's reply: (its text, its tokens, whether it ended with the end of turn)."""
    compiler, vocab, sizes, stops, _ = engine_side
    matcher = xgrammar.GrammarMatcher(compiler.compile_structural_tag(json.dumps(tag)))
    bitmask = xgrammar.allocate_token_bitmask(1, len(sizes))
    rng, text, count = random.Random(seed), b"", 0
    while count < budget + 64:
        matcher.fill_next_token_bitmask(bitmask)
        words = bitmask[0].numpy().astype(np.uint32)
        allowed = np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))
        allowed = allowed[allowed < len(sizes)]
        free = allowed[~np.isin(allowed, list(stops))]
        if not len(free):
            return text, count + 1, True  # the end of turn: one token more
        fewest = free[sizes[free] == sizes[free].min()]
        token = int(fewest[rng.randrange(len(fewest))])
        assert matcher.accept_token(token)
        text += vocab[token]
        count += 1
    return text, count, False


BODIES = [
    {"tools": [tool(t["name"]) for t in TOOLS], "tool_choice": "required"},
    *(
        {
            "tools": [tool(t["name"]) for t in TOOLS],
            "tool_choice": {"type": "function", "function": {"name": t["name"]}},
        }
        for t in TOOLS
    ),
]


@pytest.mark.parametrize("budget", [96, 320])
def test_an_adversary_that_never_stops_still_closes_the_call_within_the_budget(engine_side, budget):
    model = engine_side[-1]
    parser = "pythonic" if model.startswith("gemma") else "hermes"
    for index, body in enumerate(BODIES):
        forced = forced_call(body, parser, budget)
        if not forced.closes:
            # no call of this tool fits: a named choice can be cut (checked: not at 320)
            assert budget < 320 and isinstance(body["tool_choice"], dict)
            continue
        text, tokens, ended = walk(engine_side, forced.structural_tag(), budget, index)
        assert ended and tokens <= budget, (model, budget, body["tool_choice"], tokens, text)
        calls = forced.tool_calls(text.decode(errors="replace"))
        assert calls, text
        for call in calls:
            arguments = json.loads(call["function"]["arguments"])
            jsonschema.validate(arguments, SCHEMAS[call["function"]["name"]])


def test_the_llama3_envelope_closes_too(engine_side):
    forced = forced_call(BODIES[0], "llama3_json", 128)
    text, tokens, ended = walk(engine_side, forced.structural_tag(), 128, 7)
    assert ended and tokens <= 128 and forced.tool_calls(text.decode(errors="replace"))


def test_a_string_bound_beyond_xgrammars_repeat_limit_compiles_and_is_exact(engine_side):
    """xgrammar 0.2.8 with its cache on (as vLLM runs it) fails to compile a quantifier
    above 128 (`{0,129}`): a 40-character path at a budget of 1024 tokens needs more
    than that, so a longer bound is written in pieces; every length is read exactly."""
    from xgrammar.testing import _is_grammar_accept_string as accepts

    compiler = engine_side[0]
    for shortest, longest in [(0, 128), (0, 235), (3, 300)]:
        path = {"type": "string", "minLength": shortest, "maxLength": longest}
        schema = {"type": "object", "properties": {"path": path}, "required": ["path"]}
        held = bounded_schema(schema, 4096)["properties"]["path"]
        assert held["maxLength"] == longest
        grammar = compiler.compile_json_schema(json.dumps(held), any_whitespace=False).grammar
        for n in (0, shortest, 127, 128, 129, 200, longest, longest + 1):
            assert accepts(grammar, json.dumps("a" * n)) is (shortest <= n <= longest), n


def test_bounds_keep_the_schemas_own_and_never_cut_below_its_minimums():
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 3},
            "code": {"type": "string", "minLength": 40},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 5},
            "n": {"type": "integer", "minimum": 0},
            "x": {"type": "number", "maximum": 1.5},
            "pick": {"$ref": "#/$defs/Pick"},
            "extra": {},
        },
        "$defs": {"Pick": {"type": "string", "enum": ["a", "bb"]}},
    }
    held = bounded_schema(schema, 8)
    properties = held["properties"]
    assert properties["name"]["pattern"].endswith("{0,3}$")  # the schema's own, tighter
    assert properties["code"]["pattern"].endswith("{40,40}$")  # never below minLength
    assert properties["tags"]["maxItems"] == 5
    assert properties["tags"]["items"]["pattern"].endswith("{0,8}$")
    assert properties["n"] == {"type": "integer", "minimum": 0, "maximum": 10**8 - 1}
    assert properties["x"]["minimum"] == -(10**8 - 1) and properties["x"]["maximum"] == 1.5
    assert properties["pick"] == {"type": "string", "enum": ["a", "bb"]}  # $ref inlined
    assert "anyOf" in properties["extra"] and "$defs" not in held
    # larger k, larger worst case; the worst case counts every byte JSON allows
    assert worst_bytes(bounded_schema(schema, 9), 9) > worst_bytes(held, 8)
    assert worst_bytes(bounded_schema({"type": "string"}, 2), 2) == 2 + 4 * 2


def test_no_budget_no_bounds_and_several_calls_where_they_fit():
    body = {"tools": [tool("add"), tool("get_weather")], "tool_choice": "required"}
    assert forced_call(body, "hermes").plan() == (None, None)
    sizes, calls = forced_call(body, "hermes", 4000).plan()
    assert calls == 2 and min(sizes.values()) >= 16
    sizes, calls = forced_call(body, "hermes", 120).plan()
    assert calls == 1  # room for one call only: one call


def test_required_keeps_every_tool_a_single_call_of_which_fits():
    body = {"tools": [tool(t["name"]) for t in TOOLS], "tool_choice": "required"}
    for parser in ("hermes", "pythonic", "llama3_json"):
        for budget in (160, 512):
            sizes, calls = forced_call(body, parser, budget).plan()
            fitting = {
                t["name"]
                for t in TOOLS
                if forced_call(
                    {**body, "tool_choice": {"type": "function", "function": {"name": t["name"]}}},
                    parser,
                    budget,
                ).closes
            }
            assert set(sizes) == fitting and len(fitting) >= 4, (parser, budget, sizes)
            assert calls == 1  # several calls only where each keeps room
