"""An MCP verifiers environment as its users write one: the tools of an MCP server
(`mcp-server-time` from PyPI, over stdio, a session per call) offered through `vf.ToolEnv`,
with the official `mcp` SDK's client. (verifiers 0.3.1's own `vf.MCPEnv` reads
`Tool.inputSchema`, which the `mcp` 2.x SDK renamed: it needs `mcp<2`.)"""

import re
import shutil
import sys
from pathlib import Path

import verifiers as vf
from datasets import Dataset
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def _server() -> str:
    beside = Path(sys.executable).with_name("mcp-server-time")
    return str(beside) if beside.exists() else (shutil.which("mcp-server-time") or "")


async def get_current_time(timezone: str) -> str:
    """Get the current time in a timezone.

    Args:
        timezone: An IANA timezone name, such as Europe/Paris.
    """
    params = StdioServerParameters(command=_server(), args=[])
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        result = await session.call_tool("get_current_time", {"timezone": timezone})
    return "\n".join(getattr(part, "text", str(part)) for part in result.content)


def load_environment(max_turns: int = 2) -> vf.Environment:
    cities = ("Asia/Tokyo", "Europe/Paris", "America/New_York", "Australia/Sydney")
    rows = [{"question": f"What time is it now in {c}?", "answer": c} for c in cities]
    parser = vf.Parser()

    def names_a_time(completion, **kwargs) -> float:
        return float(bool(re.search(r"\d{1,2}:\d{2}", parser.parse_answer(completion) or "")))

    return vf.ToolEnv(
        tools=[get_current_time],
        dataset=Dataset.from_list(rows[:2]),
        eval_dataset=Dataset.from_list(rows[2:]),
        rubric=vf.Rubric(funcs=[names_a_time], parser=parser),
        max_turns=max_turns,
    )
