"""Who may talk to `rlcoach serve`: the API key, the Host and Origin checks, the bind rule.

`AccessGuard` is the ASGI middleware in front of every route:
- the key (`Authorization: Bearer`, as OpenAI clients send it, or `X-API-Key`) on every
  route but `/health`, compared in constant time and never logged;
- a request that carries an `Origin` header comes from a web page; a page must not be
  able to train or query the server because its reader's browser can reach it (a POST of
  `text/plain` needs no CORS preflight), so any Origin not listed in `allowed_origins`
  is refused with 403;
- on a loopback bind the `Host` header must name this machine (`127.0.0.1`,
  `localhost`, `::1`, or one in `allowed_hosts`): a page on a domain that re-resolves to
  127.0.0.1 (DNS rebinding) sends its own name. On another bind the check applies only
  when `allowed_hosts` is given (the names clients use are not known).

`check_exposure` refuses to bind anything but loopback without a key unless the user
said `insecure`: with no key, anyone who can reach the port can train and query.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Sequence

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from rlcoach.errors import ConfigError
from rlcoach.serve.wire import error_body

__all__ = ["AccessGuard", "check_exposure", "is_loopback"]

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, api_key: str | None, insecure: bool) -> None:
    """Refuse a keyless bind that other machines can reach, unless `insecure`."""
    if api_key or insecure or is_loopback(host):
        return
    raise ConfigError(
        f"refusing to serve on {host} without an API key: anyone who can reach the port "
        "could train and query your models; fix: export RLCOACH_API_KEY=<a long random "
        "string> (clients send it), or bind 127.0.0.1, or pass --insecure if the network "
        "is yours alone"
    )


def _host_name(header: bytes) -> str:
    """The name in a Host header, without its port (`[::1]:8000` -> `::1`)."""
    text = header.decode("latin-1").strip().lower()
    if text.startswith("["):
        return text[1 : text.find("]")] if "]" in text else text
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text


class AccessGuard:
    """ASGI middleware: Origin, Host and key checks (see the module docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        api_key: str | None,
        *,
        bind_host: str = "127.0.0.1",
        allowed_hosts: Sequence[str] = (),
        allowed_origins: Sequence[str] = (),
    ) -> None:
        self.app = app
        self.key = api_key.encode() if api_key else None
        self.origins = {o.rstrip("/").lower() for o in allowed_origins}
        hosts = {h.lower() for h in allowed_hosts}
        if is_loopback(bind_host):
            hosts |= set(LOOPBACK_NAMES)
        self.hosts: set[str] | None = hosts or None

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, status: int, message: str, code: str
    ) -> None:
        response = JSONResponse(error_body(message, code=code), status_code=status)
        await response(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        origin = headers.get(b"origin")
        if origin is not None and origin.decode("latin-1").rstrip("/").lower() not in self.origins:
            await self._refuse(
                scope,
                receive,
                send,
                403,
                f"requests from web pages (Origin {origin.decode('latin-1')[:100]!r}) are "
                "refused: a page could otherwise use the server through its reader's "
                "browser; fix: call the server from code, or start it with "
                "--allowed-origin for a page you trust",
                "origin_not_allowed",
            )
            return
        host = headers.get(b"host")
        if self.hosts is not None and host is not None and _host_name(host) not in self.hosts:
            await self._refuse(
                scope,
                receive,
                send,
                403,
                f"Host {host.decode('latin-1')[:100]!r} is not a name of this server "
                f"(allowed: {', '.join(sorted(self.hosts))}); fix: use one of them, or "
                "start the server with --allowed-host NAME",
                "host_not_allowed",
            )
            return
        if self.key is None or scope["path"] == "/health":
            await self.app(scope, receive, send)
            return
        given = headers.get(b"x-api-key", b"")
        bearer = headers.get(b"authorization", b"")
        if bearer[:7].lower() == b"bearer ":
            given = bearer[7:].strip()
        # compare_digest on bytes of any length does not short-circuit on content.
        if not hmac.compare_digest(given, self.key):
            message = ("missing API key" if not given else "invalid API key") + (
                ": send `Authorization: Bearer <key>` with the key the server was started "
                "with ($RLCOACH_API_KEY on the server); fix: RemoteBackend(url, api_key=...) "
                "or export RLCOACH_API_KEY"
            )
            await self._refuse(scope, receive, send, 401, message, "invalid_api_key")
            return
        await self.app(scope, receive, send)
