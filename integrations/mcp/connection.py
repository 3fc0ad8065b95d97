"""Connecting to an MCP server: a launch command over stdio, or a streamable-HTTP URL.

    spec = ServerSpec.from_command("uvx mcp-server-time --local-timezone UTC")
    async with connect(spec) as server:
        tools = await server.list_tools()
        result = await server.call_tool("get_current_time", {"timezone": "Etc/UTC"})

A server always runs as its own process, from its command, in its own environment (many
published servers need a different `mcp` major version than ours); it is never imported.
Each `connect()` is one session — for stdio, one server process — so a rollout that
opens its own session sees fresh server state and its calls never interleave with
another rollout's. The session is closed on every exit path (the SDK closes stdin, then
terminates the process tree). The server's stderr goes to a temporary file, and its tail
is part of every error: a server that exits at start, cannot be found, does not answer
the handshake within `startup_timeout_s`, or dies during a call raises `MCPServerError`
with what the server printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from pydantic import ConfigDict, Field, model_validator

from rlcoach.errors import RLCoachError
from rlcoach.validation import Config, Record

__all__ = ["Connection", "MCPServerError", "ServerSpec", "ToolResult", "connect"]

STDERR_TAIL_CHARS = 2000


class MCPServerError(RLCoachError, RuntimeError):
    """The server could not be started, reached, or stopped answering."""


class ServerSpec(Config):
    """Where the server is: a command (stdio) or a URL (streamable HTTP), not both."""

    model_config = ConfigDict(extra="forbid")

    command: list[str] | None = None
    """The launch command and its arguments, e.g. `["uvx", "mcp-server-time"]`."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment for the server process (merged over a safe default set)."""
    cwd: str | None = None
    url: str | None = None
    """The streamable-HTTP endpoint, e.g. `http://127.0.0.1:8000/mcp`."""
    headers: dict[str, str] = Field(default_factory=dict)
    """HTTP headers for every request (e.g. `Authorization`)."""
    startup_timeout_s: float = Field(60.0, gt=0)
    """Start-up and handshake limit."""

    @model_validator(mode="after")
    def _one_transport(self) -> ServerSpec:
        if (self.command is None) == (self.url is None):
            raise ValueError(
                f"got command={self.command!r} and url={self.url!r}: a server is reached one "
                "way; fix: give exactly one of `command` (a launch command for stdio) and "
                "`url` (a streamable-HTTP endpoint)"
            )
        if self.command is not None and not self.command:
            raise ValueError(
                "command=[] is empty: there is nothing to start; fix: give the server's "
                "launch command"
            )
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(
                f"url={self.url!r} is not an http(s) URL; fix: give the streamable-HTTP "
                "endpoint, e.g. http://127.0.0.1:8000/mcp"
            )
        return self

    @classmethod
    def from_command(cls, command: str | Sequence[str], **options: Any) -> ServerSpec:
        """From a shell-style command line (split with `shlex`) or an argument list."""
        parts = shlex.split(command) if isinstance(command, str) else list(command)
        return cls(command=parts, **options)

    @property
    def label(self) -> str:
        """How errors and reports name the server (no header values: they hold keys)."""
        return self.url if self.url is not None else shlex.join(self.command or [])


class ToolResult(Record):
    """What one tool call returned, as text the policy can read."""

    model_config = ConfigDict(extra="forbid")

    text: str
    """Text blocks, structured content (JSON) and notes for images/audio/resources."""
    is_error: bool = False
    structured: dict[str, Any] | None = None


def _stderr_tail(log: TextIO | None) -> str:
    if log is None:
        return ""
    with contextlib.suppress(OSError, ValueError):
        log.flush()
        log.seek(0)
        text = log.read()[-STDERR_TAIL_CHARS:].strip()
        log.seek(0, os.SEEK_END)
        return f"\n--- server stderr (last {STDERR_TAIL_CHARS} chars) ---\n{text}" if text else ""
    return ""


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


def _describe(error: BaseException) -> str:
    return "; ".join(f"{type(e).__name__}: {e}" for e in _leaves(error))


def result_text(result: Any) -> ToolResult:
    """Turn an MCP `CallToolResult` into text: every block kept, non-text blocks noted."""
    parts: list[str] = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} omitted: {getattr(block, 'mime_type', '') or 'unknown type'}]")
        elif kind == "resource":
            resource = block.resource
            text = getattr(resource, "text", None)
            parts.append(text if text is not None else f"[binary resource {resource.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource link {block.uri}: {getattr(block, 'name', '')}]")
        else:
            parts.append(f"[{kind or type(block).__name__} content omitted]")
    structured = result.structured_content
    if structured is not None and not parts:
        parts.append(json.dumps(structured, ensure_ascii=False))
    return ToolResult(text="\n".join(parts), is_error=bool(result.is_error), structured=structured)


class Connection:
    """One live session with a server (see the module docstring)."""

    def __init__(self, client: Any, spec: ServerSpec, log: TextIO | None) -> None:
        self._client = client
        self.spec = spec
        self._log = log

    @property
    def server_name(self) -> str:
        info = self._client.server_info
        return info.name if info is not None else self.spec.label

    @property
    def instructions(self) -> str | None:
        return self._client.instructions

    def _offers(self, capability: str) -> bool:
        capabilities = self._client.server_capabilities
        return getattr(capabilities, capability, None) is not None

    def failure(self, what: str, error: BaseException) -> MCPServerError:
        """An error naming the server, what failed, the cause and the server's stderr."""
        return MCPServerError(
            f"MCP server {self.spec.label!r}: {what} failed: "
            f"{_describe(error)}{_stderr_tail(self._log)}"
        )

    async def _pages(self, method: str, field: str, timeout_s: float) -> list[Any]:
        items: list[Any] = []
        cursor: str | None = None
        try:
            async with asyncio.timeout(timeout_s):
                for _ in range(1000):
                    page = await getattr(self._client, method)(cursor=cursor)
                    items += getattr(page, field)
                    cursor = page.next_cursor
                    if not cursor:
                        break
        except Exception as e:
            raise self.failure(method, e) from e
        return items

    async def list_tools(self, timeout_s: float = 30.0) -> list[Any]:
        """Every tool (all pages), as MCP `Tool` objects."""
        return await self._pages("list_tools", "tools", timeout_s)

    async def list_resources(self, timeout_s: float = 30.0) -> list[Any]:
        """Resources, when the server offers them (else an empty list)."""
        if not self._offers("resources"):
            return []
        return await self._pages("list_resources", "resources", timeout_s)

    async def list_prompts(self, timeout_s: float = 30.0) -> list[Any]:
        """Prompts, when the server offers them (else an empty list)."""
        if not self._offers("prompts"):
            return []
        return await self._pages("list_prompts", "prompts", timeout_s)

    async def read_resource(self, uri: str, timeout_s: float = 30.0) -> str:
        try:
            async with asyncio.timeout(timeout_s):
                result = await self._client.read_resource(uri)
        except Exception as e:
            raise self.failure(f"read_resource({uri!r})", e) from e
        return "\n".join(getattr(c, "text", None) or f"[binary {c.uri}]" for c in result.contents)

    async def call_tool(
        self, name: str, arguments: dict[str, Any], timeout_s: float = 60.0
    ) -> ToolResult:
        """Call a tool. A tool's own error comes back as `is_error`; a timeout raises
        `TimeoutError`; a transport failure (the server died) raises `MCPServerError`."""
        from mcp import MCPError
        from mcp.types import CONNECTION_CLOSED

        try:
            async with asyncio.timeout(timeout_s):
                result = await self._client.call_tool(name, arguments)
        except TimeoutError:
            raise
        except MCPError as e:
            if e.code == CONNECTION_CLOSED:  # the server is gone
                raise self.failure(f"call_tool({name!r})", e) from e
            return ToolResult(text=f"error: {e}", is_error=True)  # a JSON-RPC error answer
        except Exception as e:
            raise self.failure(f"call_tool({name!r})", e) from e
        return result_text(result)


def _transport(spec: ServerSpec, log: TextIO | None) -> Any:
    if spec.url is not None:
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        return streamable_http_client(
            spec.url, http_client=create_mcp_http_client(headers=dict(spec.headers))
        )
    from mcp import StdioServerParameters
    from mcp.client.stdio import stdio_client

    command = spec.command or []
    params = StdioServerParameters(
        command=command[0],
        args=command[1:],
        env=spec.env or None,
        cwd=Path(spec.cwd) if spec.cwd else None,
    )
    return stdio_client(params, errlog=log or sys.stderr)


@contextlib.asynccontextmanager
async def connect(spec: ServerSpec) -> AsyncIterator[Connection]:
    """Open one session with the server; closed (the process stopped) on exit."""
    from mcp import Client

    with contextlib.ExitStack() as files:
        log = (
            files.enter_context(tempfile.TemporaryFile(mode="w+", encoding="utf-8"))
            if spec.command
            else None
        )
        client = Client(_transport(spec, log), cache=None)
        connection = Connection(client, spec, log)
        try:
            async with asyncio.timeout(spec.startup_timeout_s):
                await client.__aenter__()
        except TimeoutError as e:
            raise MCPServerError(
                f"MCP server {spec.label!r} did not complete the handshake within "
                f"startup_timeout_s={spec.startup_timeout_s}; check that the command starts an "
                f"MCP server on stdio (or the URL serves MCP){_stderr_tail(log)}"
            ) from e
        except FileNotFoundError as e:
            raise MCPServerError(
                f"MCP server command {spec.label!r} not found ({e.filename or e}); install the "
                "server or give the full path to its executable"
            ) from e
        except Exception as e:
            raise connection.failure("start-up", e) from e
        try:
            yield connection
        finally:
            with contextlib.suppress(Exception):
                await client.__aexit__(None, None, None)
