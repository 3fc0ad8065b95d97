"""The API keys of the `rlcoach serve` servers this process is connected to.

A `RemoteBackend` is built with the server's key. A plain `Model` whose `base_url` is a
route of that same server (a judge on the policy endpoint's base weights, say) is
usually built without one; it borrows the key of the connected backend whose URL its own
starts with, and no other URL ever gets it. The backends are held weakly: a backend that
is gone lends nothing. This is the one process-wide registry of rlcoach, named and kept
here so that nothing else holds such state in a module global.
"""

from __future__ import annotations

import weakref
from typing import Protocol

__all__ = ["CONNECTED_SERVERS", "ConnectedServer", "ServerKeys"]


class ConnectedServer(Protocol):
    """What the registry reads of a connected backend."""

    @property
    def url(self) -> str: ...

    @property
    def api_key(self) -> str | None: ...


class ServerKeys:
    """Connected servers, held weakly, and the key for a URL under one of them."""

    def __init__(self) -> None:
        self._servers: weakref.WeakSet[ConnectedServer] = weakref.WeakSet()

    def add(self, server: ConnectedServer) -> None:
        self._servers.add(server)

    def key_for(self, url: str | None) -> str | None:
        """The key of a connected server that serves `url`, else None."""
        if not url:
            return None
        for server in list(self._servers):
            if server.api_key and (url.rstrip("/") + "/").startswith(server.url + "/"):
                return server.api_key
        return None


CONNECTED_SERVERS = ServerKeys()
"""The servers this process's `RemoteBackend`s are connected to."""
