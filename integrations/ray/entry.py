"""The one OpenAI-compatible entry point in front of the inference replicas.

Each replica is a whole policy endpoint (an engine and rlcoach's gateway, with its own
recorder). The entry point forwards each request to one of them:

- a rollout (the `X-RLCoach-Rollout` header) stays on the replica its first call went
  to, so its exchanges are recorded in one place and its prefix stays in one cache;
- a new rollout, or a request without one, goes to the least busy replica that serves
  the model asked for: `name@step` only to replicas that have loaded that step, plain
  `name` only to replicas whose latest step is the fleet's latest;
- a replica that stops answering (its process or node died) is marked lost at once;
  its rollouts in flight get HTTP 410 on every later call and when their exchanges are
  taken, so the rollout fails loudly and is run again elsewhere (`RayBackend` counts
  it), never finishing with half of its calls missing. `on_lost` tells the backend,
  which replaces the replica.

Runs uvicorn on a thread and event loop of its own, as the gateway does.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rlcoach.endpoint.gateway import EVALUATION_HEADER, ROLLOUT_HEADER
from rlcoach.errors import EngineStartError
from rlcoach.models.served_name import ServedName

__all__ = ["EntryPoint", "ReplicaState"]

logger = logging.getLogger(__name__)

LOST_STATUS = 410
_MAX_AFFINITY = 200_000
_FAILURES = (httpx.TransportError,)


@dataclass
class ReplicaState:
    """What the entry point knows of one replica."""

    replica_id: str
    url: str
    steps: dict[str, set[int]] = field(default_factory=dict)
    """Steps of each model the replica has loaded (step 0: the base weights)."""
    latest: dict[str, int] = field(default_factory=dict)
    inflight: int = 0
    served: int = 0
    lost: bool = False

    def serves(self, requested: str, fleet_latest: dict[str, int]) -> bool:
        name, step_text = ServedName.split(requested)
        if name not in self.latest:
            return True  # the base model or a name only the replica can judge
        if not step_text:
            return self.latest[name] == fleet_latest.get(name, 0)
        parsed = ServedName.parse(requested)
        return parsed is not None and parsed.step in self.steps.get(name, set())


class EntryPoint:
    """Spread requests over replicas, one rollout on one replica (see the module)."""

    def __init__(
        self,
        host: str,
        on_lost: Callable[[str], None],
        timeout_s: float = 600.0,
        advertised: str | None = None,
    ) -> None:
        """`host`: where to listen; `advertised`: the host in `url` (the node's address
        when listening on every interface)."""
        self.host = host
        self.advertised = advertised or host
        self.port = 0
        self.on_lost = on_lost
        self.replicas: dict[str, ReplicaState] = {}
        self.latest: dict[str, int] = {}
        self.lost_rollouts: OrderedDict[str, str] = OrderedDict()
        self._affinity: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()
        self._timeout = httpx.Timeout(timeout_s, connect=10.0)
        self._client: httpx.AsyncClient | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/health", self._health, methods=["GET"]),
                Route("/rlcoach/rollouts/{rollout_id}", self._take, methods=["POST"]),
            ]
        )

    @property
    def url(self) -> str:
        return f"http://{self.advertised}:{self.port}"

    # -- the fleet, changed by the backend (any thread) ------------------------------------

    def add(self, state: ReplicaState) -> None:
        with self._lock:
            self.replicas[state.replica_id] = state

    def loaded(self, replica_id: str, model: str, step: int) -> None:
        """Replica `replica_id` serves `model@step`, now its latest."""
        with self._lock:
            state = self.replicas.get(replica_id)
            if state is not None:
                state.steps.setdefault(model, {0}).add(step)
                state.latest[model] = step

    def publish(self, model: str, step: int) -> None:
        """`model`'s latest is `step` (after the replicas that have it said so)."""
        with self._lock:
            self.latest[model] = step

    def live(self) -> list[ReplicaState]:
        with self._lock:
            return [r for r in self.replicas.values() if not r.lost]

    def mark_lost(self, replica_id: str) -> bool:
        """Mark a replica lost and its rollouts with it; True the first time."""
        with self._lock:
            state = self.replicas.get(replica_id)
            if state is None or state.lost:
                return False
            state.lost = True
            for rollout, owner in list(self._affinity.items()):
                if owner == replica_id:
                    self.lost_rollouts[rollout] = replica_id
                    del self._affinity[rollout]
            while len(self.lost_rollouts) > _MAX_AFFINITY:
                self.lost_rollouts.popitem(last=False)
        logger.warning("inference replica %s is lost; its rollouts will be retried", replica_id)
        self.on_lost(replica_id)
        return True

    def remove(self, replica_id: str) -> None:
        with self._lock:
            self.replicas.pop(replica_id, None)

    # -- routing ---------------------------------------------------------------------------

    def _pick(self, rollout_id: str | None, requested: str) -> ReplicaState | str:
        """The replica for this request, or why there is none (a 410 or 503 reason)."""
        with self._lock:
            if rollout_id and rollout_id in self.lost_rollouts:
                return f"lost:{self.lost_rollouts[rollout_id]}"
            if rollout_id and (owner := self._affinity.get(rollout_id)) is not None:
                self._affinity.move_to_end(rollout_id)
                return self.replicas[owner]
            fit = [
                r for r in self.replicas.values() if not r.lost and r.serves(requested, self.latest)
            ]
            if not fit:
                return f"no replica serves {requested!r} now"
            chosen = min(fit, key=lambda r: (r.inflight, r.served))
            if rollout_id:
                self._affinity[rollout_id] = chosen.replica_id
                while len(self._affinity) > _MAX_AFFINITY:
                    self._affinity.popitem(last=False)
            return chosen

    async def _chat(self, request: Request) -> Response:
        raw = await request.body()
        try:
            body = orjson.loads(raw)
            requested = str(body.get("model", ""))
            stream = bool(body.get("stream"))
        except (orjson.JSONDecodeError, AttributeError):
            return _error(400, "the request body is not a JSON object")
        rollout_id = request.headers.get(ROLLOUT_HEADER)
        picked = self._pick(rollout_id, requested)
        if isinstance(picked, str):
            return _refusal(picked, rollout_id)
        headers = _forwarded(request)
        assert self._client is not None
        picked.inflight += 1
        picked.served += 1
        try:
            upstream = self._client.build_request(
                "POST", picked.url + "/v1/chat/completions", content=raw, headers=headers
            )
            response = await self._client.send(upstream, stream=True)
        except _FAILURES as e:
            picked.inflight -= 1
            return self._lost(picked, rollout_id, e)
        if stream:
            return StreamingResponse(
                self._relay(picked, rollout_id, response),
                status_code=response.status_code,
                media_type=response.headers.get("content-type"),
            )
        try:
            content = await response.aread()
        except _FAILURES as e:
            return self._lost(picked, rollout_id, e)
        finally:
            picked.inflight -= 1
            await response.aclose()
        return Response(content, response.status_code, media_type="application/json")

    async def _relay(
        self, picked: ReplicaState, rollout_id: str | None, response: httpx.Response
    ) -> AsyncIterator[bytes]:
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        except _FAILURES as e:
            self._lost(picked, rollout_id, e)
            raise
        finally:
            picked.inflight -= 1
            await response.aclose()

    def _lost(self, picked: ReplicaState, rollout_id: str | None, error: Exception) -> Response:
        logger.warning("replica %s failed a request: %r", picked.replica_id, error)
        self.mark_lost(picked.replica_id)
        return _refusal(f"lost:{picked.replica_id}", rollout_id)

    async def _take(self, request: Request) -> Response:
        rollout_id = request.path_params["rollout_id"]
        with self._lock:
            lost = self.lost_rollouts.pop(rollout_id, None)
            owner = self._affinity.pop(rollout_id, None)
        if lost is not None:
            return _refusal(f"lost:{lost}", rollout_id)
        if owner is None:
            return JSONResponse({"exchanges": []})
        state = self.replicas.get(owner)
        assert self._client is not None and state is not None
        try:
            response = await self._client.post(f"{state.url}/rlcoach/rollouts/{rollout_id}")
        except _FAILURES as e:
            self.mark_lost(owner)
            logger.warning("taking rollout %s from replica %s failed: %r", rollout_id, owner, e)
            return _refusal(f"lost:{owner}", rollout_id)
        return Response(response.content, response.status_code, media_type="application/json")

    async def _models(self, request: Request) -> Response:
        names: dict[str, None] = {}
        assert self._client is not None
        for state in self.live():
            try:
                response = await self._client.get(state.url + "/v1/models")
            except _FAILURES:
                continue
            for item in response.json().get("data", []):
                names.setdefault(item["id"])
        now = int(time.time())
        data = [{"id": n, "object": "model", "created": now, "owned_by": "rlcoach"} for n in names]
        return JSONResponse({"object": "list", "data": data})

    async def _health(self, request: Request) -> Response:
        live = self.live()
        body = {"status": "ok" if live else "no replica", "replicas": len(live)}
        return JSONResponse(body, status_code=200 if live else 503)

    # -- the serving thread ----------------------------------------------------------------

    def start(self) -> None:
        """Start uvicorn on its own thread and loop; return once it listens."""
        import uvicorn

        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._loop = asyncio.new_event_loop()
        limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)

        def serve() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._client = httpx.AsyncClient(timeout=self._timeout, limits=limits)
            self._loop.run_until_complete(self._server.serve(sockets=[sock]))
            self._loop.run_until_complete(self._client.aclose())

        self._thread = threading.Thread(target=serve, name="rlcoach-ray-entry", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise EngineStartError(f"the Ray entry point did not start on {self.url}")
            time.sleep(0.01)
        logger.info("Ray entry point listening on %s/v1", self.url)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._loop is not None and not self._loop.is_running():
            self._loop.close()
        self._thread = None


def _forwarded(request: Request) -> dict[str, str]:
    keep = ("content-type", "authorization", ROLLOUT_HEADER, EVALUATION_HEADER, "accept")
    return {k: v for k, v in request.headers.items() if k.lower() in keep}


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


def _refusal(reason: str, rollout_id: str | None) -> JSONResponse:
    if reason.startswith("lost:"):
        replica = reason.removeprefix("lost:")
        if rollout_id:
            return _error(
                LOST_STATUS,
                f"rollout {rollout_id} was served by inference replica {replica}, which is "
                "lost; the rollout must run again from its start (RayBackend retries it)",
                "replica_lost",
            )
        return _error(503, f"inference replica {replica} is lost; retry", "server_error")
    return _error(503, f"{reason}; retry when a replica serves it", "server_error")
