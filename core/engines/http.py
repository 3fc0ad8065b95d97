"""The HTTP client between the policy endpoint and its engine's server (vLLM).

Every rollout's call crosses this hop, so at 256 calls in flight its cost per call is
the endpoint's cost. httpx (httpcore 1.0) rescans its whole connection pool for every
request it queues and every connection it frees, which at that concurrency took most of
the endpoint's CPU (bench/gateway_overhead.py); aiohttp's connector does not, and parses
responses in C. aiohttp is a dependency of vLLM, so it is there wherever vLLM is; where
it is missing the same interface runs on httpx.

`EngineHTTP` reaches the server over TCP or, with `uds`, its Unix socket (how
`EngineProcess` runs engines), sends `headers` (the engine's key) with every request,
keeps connections alive for `keepalive_s` (under vLLM's own 5 s, so a connection is
never reused at the moment the server closes it) and raises `EngineConnectionError` for
anything that is not an HTTP answer (refused, reset, timed out).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from rlcoach.engines import fastjson
from rlcoach.errors import EngineError

__all__ = ["EngineConnectionError", "EngineHTTP", "EngineResponse", "EngineStatusError"]


class EngineConnectionError(EngineError):
    """The engine's server did not answer (connection refused or reset, timeout); the
    engine's client turns it into an `EngineError` that names the call."""


class EngineStatusError(EngineError):
    """A streamed request was answered with a status other than 200; `response` holds the
    whole answer (for the engine's client to turn into its `EngineHTTPError`)."""

    def __init__(self, response: EngineResponse) -> None:
        super().__init__(f"HTTP {response.status_code}: {response.text[:200]}")
        self.response = response


@dataclass(frozen=True, slots=True)
class EngineResponse:
    status_code: int
    content: bytes

    def json(self) -> Any:
        return fastjson.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode(errors="replace")

    @property
    def reason_phrase(self) -> str:
        try:
            return HTTPStatus(self.status_code).phrase
        except ValueError:
            return f"HTTP {self.status_code}"


class EngineHTTP:
    """Requests to one server (`base_url`, or `uds`: its Unix socket), over aiohttp where
    installed (and `use_aiohttp`), else httpx."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float,
        uds: str | None = None,
        headers: dict[str, str] | None = None,
        max_connections: int = 1024,
        keepalive_s: float = 2.0,
        use_aiohttp: bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.uds = uds
        self.headers = dict(headers or {})
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self.keepalive_s = keepalive_s
        self._session: Any = None
        self._httpx: Any = None
        self._aiohttp: Any = None
        if use_aiohttp:
            try:
                import aiohttp

                self._aiohttp = aiohttp
            except ImportError:
                self._aiohttp = None

    @property
    def backend(self) -> str:
        return "aiohttp" if self._aiohttp is not None else "httpx"

    def _client(self) -> Any:
        # Made on first use, inside the event loop that will use it.
        if self._aiohttp is not None:
            if self._session is None:
                aiohttp = self._aiohttp
                pool = {"limit": self.max_connections, "keepalive_timeout": self.keepalive_s}
                connector = (
                    aiohttp.UnixConnector(path=self.uds, **pool)
                    if self.uds is not None
                    else aiohttp.TCPConnector(**pool)
                )
                self._session = aiohttp.ClientSession(
                    connector=connector,
                    timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                    headers=self.headers,
                    skip_auto_headers=("User-Agent",),
                )
            return self._session
        if self._httpx is None:
            import httpx

            limits = httpx.Limits(
                max_connections=self.max_connections,
                max_keepalive_connections=256,
                keepalive_expiry=self.keepalive_s,
            )
            self._httpx = httpx.AsyncClient(
                base_url=self.base_url,
                transport=httpx.AsyncHTTPTransport(uds=self.uds, limits=limits),
                headers=self.headers,
                timeout=httpx.Timeout(self.timeout_s),
            )
        return self._httpx

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> EngineResponse:
        """Send one request; its answer whatever the status, or `EngineConnectionError`."""
        client = self._client()
        body = fastjson.dumps(json) if json is not None else None
        headers = {"content-type": "application/json"} if body is not None else None
        if self._aiohttp is not None:
            aiohttp = self._aiohttp
            options: dict[str, Any] = {"data": body, "headers": headers, "params": params}
            if timeout_s is not None:
                options["timeout"] = aiohttp.ClientTimeout(total=timeout_s)
            try:
                async with client.request(method, self.base_url + path, **options) as answer:
                    return EngineResponse(answer.status, await answer.read())
            except (aiohttp.ClientError, TimeoutError) as e:
                raise EngineConnectionError(f"{method} {path}: {e!r}") from e
        import httpx

        try:
            answer = await client.request(
                method,
                path,
                content=body,
                headers=headers,
                params=params,
                timeout=timeout_s if timeout_s is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except httpx.HTTPError as e:
            raise EngineConnectionError(f"{method} {path}: {e!r}") from e
        return EngineResponse(answer.status_code, answer.content)

    async def lines(self, method: str, path: str, *, json: Any = None) -> AsyncIterator[bytes]:
        """A streamed answer's lines as they arrive (server-sent events). A status other
        than 200 raises `EngineStatusError`; no answer, `EngineConnectionError`."""
        client = self._client()
        body = fastjson.dumps(json) if json is not None else None
        headers = {"content-type": "application/json"} if body is not None else None
        if self._aiohttp is not None:
            aiohttp = self._aiohttp
            try:
                async with client.request(
                    method, self.base_url + path, data=body, headers=headers
                ) as answer:
                    if answer.status != 200:
                        raise EngineStatusError(EngineResponse(answer.status, await answer.read()))
                    async for line in answer.content:
                        yield line.rstrip(b"\r\n")
            except (aiohttp.ClientError, TimeoutError) as e:
                raise EngineConnectionError(f"{method} {path}: {e!r}") from e
            return
        import httpx

        try:
            async with client.stream(method, path, content=body, headers=headers) as answer:
                if answer.status_code != 200:
                    raise EngineStatusError(
                        EngineResponse(answer.status_code, await answer.aread())
                    )
                async for line in answer.aiter_lines():
                    yield line.encode()
        except httpx.HTTPError as e:
            raise EngineConnectionError(f"{method} {path}: {e!r}") from e

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
        client, self._httpx = self._httpx, None
        if client is not None:
            await client.aclose()
