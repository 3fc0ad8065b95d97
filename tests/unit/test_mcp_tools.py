"""Converting MCP input schemas to OpenAI tool schemas, and checking call arguments."""

from rlcoach.integrations.mcp import convert_tools


def _tool(name, schema, description="d"):
    return {"name": name, "description": description, "inputSchema": schema}


def test_refs_are_inlined_and_noise_dropped_but_meaning_kept():
    schema = {
        "type": "object",
        "title": "Args",
        "$defs": {
            "Point": {
                "type": "object",
                "title": "Point",
                "properties": {"x": {"type": "number", "title": "X"}, "title": {"type": "string"}},
                "required": ["x"],
            }
        },
        "properties": {
            "at": {"$ref": "#/$defs/Point", "description": "where"},
            "mode": {"enum": ["a", "b"], "default": "a"},
            "tags": {"type": "array", "items": {"$ref": "#/$defs/Point"}},
        },
        "required": ["at"],
    }
    tools = convert_tools([_tool("move", schema)])
    params = tools.tools[0]["function"]["parameters"]
    assert params["properties"]["at"] == {
        "type": "object",
        "properties": {"x": {"type": "number"}, "title": {"type": "string"}},
        "required": ["x"],
        "description": "where",
    }  # a property named "title" survives
    assert params["properties"]["tags"]["items"]["required"] == ["x"]
    assert params["properties"]["mode"] == {"enum": ["a", "b"], "default": "a"}
    assert params["required"] == ["at"] and "$defs" not in params and "title" not in params


def test_inexpressible_tools_are_skipped_with_a_reason_and_names_adapted():
    recursive = {
        "type": "object",
        "$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}},
        "properties": {"head": {"$ref": "#/$defs/Node"}},
    }
    tools = convert_tools(
        [
            _tool("list", recursive),
            _tool("scalar", {"type": "string"}),
            _tool("remote", {"type": "object", "properties": {"a": {"$ref": "https://x/s.json"}}}),
            _tool("files/read.v2", None),
            _tool("files_read_v2", {"type": "object", "properties": {}}),
        ]
    )
    reasons = dict(tools.skipped)
    assert "recursive" in reasons["list"]
    assert "type 'string'" in reasons["scalar"]
    assert "outside the schema" in reasons["remote"]
    assert tools.names == ["files_read_v2", "files_read_v2_2"]
    assert tools.server_names == {
        "files_read_v2": "files/read.v2",
        "files_read_v2_2": "files_read_v2",
    }
    assert tools.check_call("files_read_v2", "").name == "files/read.v2"


def test_argument_checks_name_the_tool_and_the_problem():
    tools = convert_tools(
        [
            _tool(
                "add",
                {
                    "type": "object",
                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    "required": ["a", "b"],
                },
            )
        ]
    )
    assert tools.check_call("add", '{"a": 1, "b": 2}').arguments == {"a": 1, "b": 2}
    assert "at b: 'x' is not of type 'integer'" in tools.check_call("add", '{"a":1,"b":"x"}').error
    assert "must be a JSON object, not list" in tools.check_call("add", "[1, 2]").error
    assert "'b' is a required property" in tools.check_call("add", {"a": 1}).error


def test_tools_are_offered_strict_when_asked_unless_a_schema_is_beyond_the_grammar():
    from rlcoach.integrations.mcp.agent import AgentConfig, offered_tools

    plain = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    tools = convert_tools([_tool("read", plain), _tool("stat", plain)])
    assert tools.unforceable() == []
    assert not any("strict" in t["function"] for t in offered_tools(tools, AgentConfig()))
    offered = offered_tools(tools, AgentConfig(strict_tools=True))
    assert [t["function"]["strict"] for t in offered] == [True, True]
    assert "strict" not in tools.tools[0]["function"]  # the tool set itself is unchanged
    finish = offered_tools(tools, AgentConfig(finish_tool=True, strict_tools=False))
    assert [t["function"]["name"] for t in finish] == ["read", "stat", "final_answer"]
    assert not any("strict" in t["function"] for t in finish)

    # xgrammar ignores `not`: forcing or strict-checking such a tool would break the promise,
    # so the whole set is offered as it is and its calls are checked after sampling.
    odd = {"type": "object", "properties": {"n": {"type": "integer", "not": {"const": 0}}}}
    mixed = convert_tools([_tool("read", plain), _tool("pick", odd)])
    [problem] = mixed.unforceable()
    assert "tool 'pick'" in problem and "`not` at #/properties/n" in problem
    strict = AgentConfig(strict_tools=True)
    assert not any("strict" in t["function"] for t in offered_tools(mixed, strict))
