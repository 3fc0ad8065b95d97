"""Exploring real MCP server subprocesses over stdio: `mcp-server-time` from PyPI, and
`mcp_explore_server.py` (ours) with annotated read-only and destructive tools, tools
judged by name, a server that wants credentials, one with only destructive tools and
one that crashes. No policy is involved: exploration needs none."""

import json
import sys
import time
from pathlib import Path

import pytest

from rlcoach.autorl.grounded import answer_facts, grounded_scenarios
from rlcoach.errors import ConfigError
from rlcoach.integrations.mcp import MCPServerError, ServerSpec
from rlcoach.integrations.mcp.discovery import discover
from rlcoach.integrations.mcp.explore import explore

TIME = ServerSpec(command=[str(Path(sys.executable).with_name("mcp-server-time"))])
SERVER = str(Path(__file__).with_name("mcp_explore_server.py"))


def ours(mode: str) -> ServerSpec:
    return ServerSpec(command=[sys.executable, SERVER, mode])


async def explored(spec: ServerSpec, sandbox: Path, **options):
    found = await discover(spec, demonstration=False, **options)
    return found, await explore(spec, found.tools, found.safety, sandbox=sandbox, budget_s=60)


async def test_the_time_server_is_explored_into_grounded_scenarios(tmp_path):
    found, result = await explored(TIME, tmp_path / "sandbox")
    assert {n: v.rule for n, v in found.safety.items()} == {
        "get_current_time": "annotated read-only (readOnlyHint=true)",
        "convert_time": "annotated read-only (readOnlyHint=true)",
    }
    worked = {c.tool for c in result.calls}
    assert worked == {"get_current_time", "convert_time"}
    for call in result.calls:
        assert json.loads(call.result)  # the server's real JSON answer
        if call.tool == "convert_time":
            hour, minute = call.arguments["time"].split(":")  # synthesized as HH:MM
            assert len(hour) == 2 and len(minute) == 2
    assert (tmp_path / "sandbox" / "work").is_dir() and (tmp_path / "sandbox" / "home").is_dir()
    records = grounded_scenarios(result.calls, 12)
    assert len(records) == 12
    for record in records:
        arguments = json.loads(record.metadata["arguments"])
        assert all(v in record.text for v in arguments.values())
        facts = answer_facts(record)  # what distinguishes the answer, never the request's
        assert facts and not any(f.value in record.text for f in facts)
    assert sum(any(f.kind in ("time", "date") for f in answer_facts(r)) for r in records) >= 8


async def test_unsafe_tools_are_not_called_unless_allowed_and_errors_teach(tmp_path):
    found, result = await explored(ours("mixed"), tmp_path / "a")
    rules = {n: (v.allowed, v.rule) for n, v in found.safety.items()}
    assert rules["lookup_city"] == (True, "annotated read-only (readOnlyHint=true)")
    destructive = "annotated as a destructive write (destructiveHint=true)"
    assert rules["delete_city"] == (False, destructive)
    assert rules["send_postcard"] == (False, "unannotated; its name says 'send'")
    assert rules["city_count"][0] is True
    assert found.tools.names == ["lookup_city", "city_count"]  # unsafe ones are not offered
    lookup = result.report("lookup_city")
    assert lookup.errors and lookup.lessons  # the first guesses were refused...
    cities = {c.arguments["city"] for c in result.calls if c.tool == "lookup_city"}
    assert cities == {"Lisbon", "Oslo", "Quito"}  # ...and the error named the valid ones
    assert not list((tmp_path / "a" / "work").glob("*.called"))
    found, result = await explored(ours("mixed"), tmp_path / "b", allow_unsafe=True)
    assert found.safety["delete_city"].allowed and result.report("delete_city").calls
    # what the destructive tools wrote, they wrote in the private working directory
    assert {p.name for p in (tmp_path / "b" / "work").glob("*.called")} == {
        "delete_city.called",
        "send_postcard.called",
    }


async def test_bad_servers_get_an_error_naming_what_is_missing(tmp_path):
    with pytest.raises(ConfigError) as missing:
        await explored(ours("credentials"), tmp_path / "c")
    message = str(missing.value)
    assert "WEATHER_API_KEY" in message and "--env NAME=value" in message
    with pytest.raises(ConfigError) as unsafe:
        await discover(ours("destructive"), demonstration=False)
    message = str(unsafe.value)
    assert "--allow-unsafe-tools" in message and "drop_table" in message
    assert "purge_cache: unannotated; its name says 'purge'" in message
    started = time.perf_counter()
    with pytest.raises(MCPServerError) as crashed:
        await explored(ours("crash"), tmp_path / "d")
    assert "the backend is gone" in str(crashed.value)  # the server's stderr
    assert time.perf_counter() - started < 30
