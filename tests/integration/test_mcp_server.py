"""MCP connections against real servers: our inventory server over stdio and over
streamable HTTP (started here on 127.0.0.1), the third-party `mcp-server-time` from PyPI
over stdio, and a server with faults on purpose. No policy model is involved."""

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlcoach.integrations.mcp import MCPServerError, ServerSpec, connect, convert_tools

INVENTORY = ServerSpec(command=[sys.executable, "-m", "rlcoach.integrations.mcp.inventory"])
FAULTY = ServerSpec(command=[sys.executable, str(Path(__file__).with_name("mcp_faulty_server.py"))])


async def _exercise_inventory(spec: ServerSpec) -> None:
    async with connect(spec) as server:
        assert server.server_name == "rlcoach-inventory"
        tools = convert_tools(await server.list_tools())
        assert tools.names == [
            "search_items",
            "get_item",
            "update_stock",
            "create_order",
            "list_orders",
        ]
        order = tools.schemas["create_order"]
        assert order["required"] == ["sku", "quantity", "customer"]
        assert order["properties"]["customer"]["required"] == ["name", "email"]  # $ref inlined
        assert order["properties"]["shipping"]["enum"] == ["standard", "express"]
        assert "$defs" not in order and "title" not in order
        assert [r.uri for r in await server.list_resources()] == ["inventory://catalog"]
        assert [p.name for p in await server.list_prompts()] == ["restock_report"]
        assert "blue widget" in await server.read_resource("inventory://catalog")

        ok = await server.call_tool("get_item", {"sku": "WID-100"})
        assert not ok.is_error and '"stock": 42' in ok.text
        missing = await server.call_tool("get_item", {"sku": "NOPE-1"})  # the tool's own error
        assert missing.is_error and "no item with SKU 'NOPE-1'" in missing.text

        bad = tools.check_call(
            "create_order", '{"sku": "WID-100", "quantity": 0, "customer": {"name": "Ann"}}'
        )
        assert bad.arguments is None and "create_order" in bad.error and "customer" in bad.error
        assert "not valid JSON" in tools.check_call("get_item", "{sku: 1").error
        assert "unknown tool 'get_items'" in tools.check_call("get_items", "{}").error
        good = tools.check_call(
            "create_order",
            {
                "sku": "WID-100",
                "quantity": 2,
                "customer": {"name": "Ann", "email": "ann@example.com"},
            },
        )
        assert good.error is None
        placed = await server.call_tool(good.name, good.arguments)
        assert not placed.is_error and '"total": 5.0' in placed.text


async def test_inventory_server_over_stdio():
    await _exercise_inventory(INVENTORY)


@pytest.fixture(scope="module")
def http_inventory():
    """Our inventory server as its own process, serving streamable HTTP on 127.0.0.1."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [*INVENTORY.command, "--transport", "http", "--port", str(port)], stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read().decode()
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.2)
    yield f"http://127.0.0.1:{port}/mcp"
    process.terminate()
    process.wait(timeout=30)


async def test_inventory_server_over_streamable_http(http_inventory):
    await _exercise_inventory(ServerSpec(url=http_inventory, headers={"X-Test": "1"}))


async def test_third_party_time_server_over_stdio():
    command = shutil.which("mcp-server-time", path=str(Path(sys.executable).parent))
    assert command, "mcp-server-time is installed by the Makefile"
    async with connect(ServerSpec.from_command(f"{command} --local-timezone Etc/UTC")) as server:
        tools = convert_tools(await server.list_tools())
        assert {"get_current_time", "convert_time"} <= set(tools.names)
        check = tools.check_call(
            "convert_time",
            '{"source_timezone": "Europe/Paris", "time": "12:00", "target_timezone": "Asia/Tokyo"}',
        )
        result = await server.call_tool(check.name, check.arguments)
        assert not result.is_error and "Asia/Tokyo" in result.text
        wrong = await server.call_tool("get_current_time", {"timezone": "Mars/Olympus"})
        assert wrong.is_error and "Mars/Olympus" in wrong.text


async def test_server_that_exits_at_start_reports_its_stderr():
    spec = ServerSpec(
        command=[
            sys.executable,
            "-c",
            "import sys; print('no database configured', file=sys.stderr); sys.exit(3)",
        ]
    )
    with pytest.raises(MCPServerError, match=r"(?s)start-up failed.*no database configured"):
        async with connect(spec):
            pass
    with pytest.raises(MCPServerError, match="not found"):
        async with connect(ServerSpec(command=["/nonexistent/mcp-server"])):
            pass
    with pytest.raises(MCPServerError, match="handshake within startup_timeout_s=2"):
        async with connect(
            ServerSpec(
                command=[sys.executable, "-c", "import time; time.sleep(60)"], startup_timeout_s=2
            )
        ):
            pass


async def test_hanging_failing_and_crashing_tools():
    async with connect(FAULTY) as server:
        failed = await server.call_tool("fail", {"reason": "disk full"})
        assert failed.is_error and "failed on purpose: disk full" in failed.text
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await server.call_tool("hang", {}, timeout_s=1.0)
        assert time.monotonic() - started < 10
    async with connect(FAULTY) as server:
        with pytest.raises(MCPServerError, match=r"(?s)call_tool\('crash'\).*crashing on purpose"):
            await server.call_tool("crash", {}, timeout_s=30)


def test_spec_rejects_ambiguous_or_bad_transports():
    with pytest.raises(ValueError, match="exactly one of"):
        ServerSpec(command=["x"], url="http://127.0.0.1:1/mcp")
    with pytest.raises(ValueError, match="not an http"):
        ServerSpec(url="127.0.0.1:8000/mcp")
    assert ServerSpec.from_command("uvx mcp-server-time --local-timezone 'Etc/UTC'").command == [
        "uvx",
        "mcp-server-time",
        "--local-timezone",
        "Etc/UTC",
    ]
