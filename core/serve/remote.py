"""RemoteBackend: the `Backend` protocol over HTTP, against `rlcoach serve`.

    backend = LocalBackend(".rlcoach")                          # this machine
    backend = RemoteBackend("http://gpu-box:8000", api_key=KEY)  # a server elsewhere

Everything else in user code stays as it is: `model.openai_client()` points at the
server's policy endpoint with the server's key, rollout scopes fetch their recorded
exchanges from it, `model.train(groups)` uploads the groups and waits for the
streamed result, and `model.train_sft(examples)` does the same for SFT. Training is
retried with the same request id after a dropped connection, a 429/5xx or a server
restart, and the server trains each id once, so a retry never trains twice. Every call
has a timeout; the training stream carries heartbeats, so a silent connection is noticed
within `read_timeout_s`.

A plain `Model` whose URL points at a server this process is connected to (a judge on
the base weights, say) is given that server's key, and no other URL ever is.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import httpx

from rlcoach.config import SFTConfig, TrainConfig, parse_config
from rlcoach.errors import (
    ConfigError,
    RemoteError,
    TrainingDataError,
    UnknownModelError,
)
from rlcoach.paths import DEFAULT_ROOT, RunPaths
from rlcoach.runtime.server_keys import CONNECTED_SERVERS
from rlcoach.serve.wire import (
    API_PREFIX,
    CheckpointList,
    LogRequest,
    ModelRef,
    RegisterResponse,
    SFTRequest,
    StepResultWire,
    TrainEvent,
    TrainRequest,
)
from rlcoach.trajectory.exchange import Exchange
from rlcoach.trajectory.trajectories import ChatRecord, Trajectory, TrajectoryGroup

if TYPE_CHECKING:
    from rlcoach.backend.local import StepResult
    from rlcoach.model import TrainableModel

__all__ = ["RemoteBackend", "key_for_url"]

logger = logging.getLogger(__name__)


def key_for_url(url: str | None) -> str | None:
    """The key of a connected `RemoteBackend` whose server serves `url`, else None."""
    return CONNECTED_SERVERS.key_for(url)


class RemoteBackend:
    """Train and serve models on an `rlcoach serve` server."""

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        *,
        root: str | os.PathLike[str] = DEFAULT_ROOT,
        timeout_s: float = 60.0,
        read_timeout_s: float = 120.0,
        retry_for_s: float = 900.0,
    ) -> None:
        """`api_key` defaults to $RLCOACH_API_KEY. `root` is a folder on this machine for
        files the user code writes beside a run (datasets, databases); checkpoints live on
        the server. `retry_for_s` bounds how long a training request keeps retrying."""
        if not url.startswith(("http://", "https://")):
            raise ConfigError(
                f"server URL {url!r} must start with http:// or https://; fix: "
                "RemoteBackend('http://host:8000', api_key=...)"
            )
        self._url = url.rstrip("/")
        self._api_key = api_key if api_key is not None else os.environ.get("RLCOACH_API_KEY")
        self.root = Path(root).absolute()
        self.timeout_s = timeout_s
        self.read_timeout_s = read_timeout_s
        self.retry_for_s = retry_for_s
        self._client: httpx.AsyncClient | None = None
        CONNECTED_SERVERS.add(self)

    @property
    def url(self) -> str:
        return self._url

    @property
    def api_key(self) -> str:
        return self._api_key or "none"

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
            self._client = httpx.AsyncClient(
                base_url=self._url,
                headers=headers,
                timeout=httpx.Timeout(self.timeout_s, read=self.read_timeout_s),
            )
        return self._client

    async def __aenter__(self) -> RemoteBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # -- the Backend protocol ------------------------------------------------------------

    async def register(self, model: TrainableModel) -> None:
        ref = _ref(model, model.config)
        response = await self._call("POST", f"{API_PREFIX}/models", content=ref.model_dump_json())
        answer = RegisterResponse.model_validate_json(response.content)
        model.step = answer.step

    def paths(self, model: TrainableModel) -> RunPaths:
        return RunPaths(self.root, model.project, model.name)

    async def take_exchanges(self, rollout_id: str) -> list[Exchange]:
        response = await self._call("POST", f"{API_PREFIX}/rollouts/{rollout_id}")
        return [Exchange.from_wire(e) for e in response.json()["exchanges"]]

    async def train(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        config: TrainConfig | dict[str, Any] | None = None,
        **options: Any,
    ) -> StepResult:
        """Upload the groups and wait for the step; retried with one request id.

        `options`: settings for this step as ART's `backend.train(model, groups,
        learning_rate=...)` passes them (art_config.py), over `config` or the model's."""
        train_config = parse_config(TrainConfig, config) if config is not None else None
        if options:
            from rlcoach.compat.art_config import train_options

            base = train_config or model.config
            update = train_options(options)
            train_config = parse_config(TrainConfig, {**base.model_dump(), **update})
        request = TrainRequest(
            request_id=uuid.uuid4().hex,
            model=_ref(model, model.config),
            groups=groups,
            config=train_config,
        )
        return await self._submit(model, "train", request, progress=False)

    async def log(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        split: str = "val",
        *,
        metrics: Mapping[str, float] | None = None,
        step: int | None = None,
    ) -> dict[str, Any]:
        """Record groups that were not trained on, on the server (evaluation.py)."""
        request = LogRequest(
            model=_ref(model, model.config),
            groups=groups,
            split=split,
            step=step,
            metrics=dict(metrics or {}),
        )
        response = await self._call("POST", f"{API_PREFIX}/log", content=request.model_dump_json())
        return dict(response.json()["record"])

    async def train_sft(
        self,
        model: TrainableModel,
        data: Sequence[Trajectory | ChatRecord],
        config: SFTConfig | dict[str, Any] | None = None,
        *,
        progress: bool = False,
    ) -> StepResult:
        """Supervised fine-tuning on the server as one step (see `LocalBackend.train_sft`);
        retried with one request id like `train`."""
        request = SFTRequest(
            request_id=uuid.uuid4().hex,
            model=_ref(model, model.config),
            examples=list(data),
            config=parse_config(SFTConfig, config),
        )
        return await self._submit(model, "train_sft", request, progress=progress)

    async def _submit(
        self, model: TrainableModel, route: str, request: TrainRequest | SFTRequest, progress: bool
    ) -> StepResult:
        """Send a training request until the server answers its result or a final error."""
        body = request.model_dump_json().encode()
        deadline = asyncio.get_running_loop().time() + self.retry_for_s
        pause = 0.5
        while True:
            try:
                wire = await self._train_once(route, request.request_id, body, progress)
                break
            except (httpx.TransportError, RemoteError) as e:
                if isinstance(e, RemoteError) and not e.retryable:
                    raise
                if asyncio.get_running_loop().time() + pause > deadline:
                    raise RemoteError(
                        f"training request {request.request_id} did not complete within "
                        f"{self.retry_for_s:.0f} s of retries (last error: {e!r}); the server "
                        "keeps the upload — fix: check the server, then train again",
                        retryable=True,
                    ) from e
                logger.warning(
                    "training request %s: %r; retrying in %.1f s", request.request_id, e, pause
                )
                await asyncio.sleep(pause)
                pause = min(pause * 2, 10.0)
        model.step = max(model.step, wire.step)
        return _step_result(wire)

    async def _train_once(
        self, route: str, request_id: str, body: bytes, progress: bool
    ) -> StepResultWire:
        http = self._http()
        bar = None
        if progress:  # the server's heartbeats tick a bar that shows the time spent
            from tqdm.auto import tqdm

            bar = tqdm(desc=f"{route} on the server", unit="heartbeat")
        try:
            return await self._read_events(http, route, request_id, body, bar)
        finally:
            if bar is not None:
                bar.close()

    async def _read_events(
        self, http: httpx.AsyncClient, route: str, request_id: str, body: bytes, bar: Any
    ) -> StepResultWire:
        async with http.stream(
            "POST",
            f"{API_PREFIX}/{route}",
            content=body,
            headers={"content-type": "application/json"},
        ) as response:
            if response.status_code != 200:
                await response.aread()
                raise _error(response)
            async for line in response.aiter_lines():
                if not line.strip():
                    continue
                event = TrainEvent.model_validate_json(line)
                if event.event == "result" and event.result is not None:
                    return event.result
                if event.event == "error":
                    message = event.error.message if event.error else "unknown error"
                    raise RemoteError(
                        f"the server could not train request {request_id}: {message}",
                        retryable=event.retryable,
                    )
                if bar is not None and event.event == "heartbeat":
                    bar.update()
        raise RemoteError(
            f"the training stream of {request_id} ended without a result", retryable=True
        )

    # -- more than the protocol ----------------------------------------------------------

    async def checkpoints(self, model: TrainableModel) -> CheckpointList:
        response = await self._call("GET", _model_path(model) + "/checkpoints")
        return CheckpointList.model_validate_json(response.content)

    async def delete_checkpoint(self, model: TrainableModel, step: int) -> None:
        await self._call("DELETE", _model_path(model) + f"/checkpoints/{step}")

    async def delete_checkpoints(
        self,
        model: TrainableModel,
        best_checkpoint_metric: str = "val/reward",
        *,
        keep_last: int = 1,
        keep_best: int = 1,
        best_mode: Literal["max", "min"] = "max",
    ) -> list[int]:
        """The server's checkpoints of `model` but those evaluation.py keeps, deleted."""
        from rlcoach.backend.retention import SCORED_EVENTS, metric_by_step, steps_to_keep

        listed = await self.checkpoints(model)
        records = (await self.metrics(model)).get("records", [])
        keep = steps_to_keep(
            [c.step for c in listed.checkpoints],
            listed.latest,
            keep_last=keep_last,
            keep_best=keep_best,
            scores=metric_by_step(records, best_checkpoint_metric, SCORED_EVENTS),
            mode=best_mode,
        )
        deleted = sorted(c.step for c in listed.checkpoints if c.step not in keep)
        for step in deleted:
            await self.delete_checkpoint(model, step)
        return deleted

    async def metrics(self, model: TrainableModel | None = None) -> dict[str, Any]:
        """The server's counters, or a model's step records when `model` is given."""
        path = _model_path(model) + "/metrics" if model else f"{API_PREFIX}/metrics"
        return dict((await self._call("GET", path)).json())

    async def status(self) -> dict[str, Any]:
        return dict((await self._call("GET", f"{API_PREFIX}/status")).json())

    async def health(self) -> bool:
        try:
            response = await self._http().get("/health", timeout=5.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request; connection errors and 429/503 are retried a few times."""
        for attempt in range(4):
            try:
                response = await self._http().request(method, path, **kwargs)
            except httpx.TransportError as e:
                if attempt == 3:
                    raise RemoteError(
                        f"{method} {self._url}{path} failed: {e!r}; fix: check "
                        "that `rlcoach serve` runs there",
                        retryable=True,
                    ) from e
                await asyncio.sleep(0.5 * 2**attempt)
                continue
            if response.status_code in (429, 502, 503) and attempt < 3:
                await asyncio.sleep(0.5 * 2**attempt)
                continue
            if response.status_code >= 400:
                raise _error(response)
            return response
        raise AssertionError("unreachable")


def _ref(model: TrainableModel, config: TrainConfig) -> ModelRef:
    return ModelRef(
        name=model.name, project=model.project, base_model=model.base_model, config=config
    )


def _model_path(model: TrainableModel) -> str:
    return f"{API_PREFIX}/models/{model.project}/{model.name}"


def _error(response: httpx.Response) -> Exception:
    """The rlcoach error for a refused request (OpenAI-shaped body)."""
    try:
        error = response.json()["error"]
        message, code = str(error.get("message")), error.get("code")
    except (ValueError, KeyError, TypeError, AttributeError):
        message, code = response.text[:500], None
    status = response.status_code
    text = f"the server answered {status}: {message}"
    if status == 400 and code == "invalid_training_data":
        return TrainingDataError(text)
    if status in (400, 401, 403, 409):
        return ConfigError(text)
    if status == 404 and code == "model_not_found":
        return UnknownModelError(text)
    if status == 413:
        return TrainingDataError(text)
    retryable = status in (408, 429) or (status >= 500 and status != 507)  # 507: disk full
    return RemoteError(text, status=status, code=code, retryable=retryable)


def _step_result(wire: StepResultWire) -> StepResult:
    from rlcoach.backend.local import StepResult
    from rlcoach.rollout.staleness import Staleness
    from rlcoach.trainer.base import SFTStats, StepStats

    kind = SFTStats if wire.kind == "sft" else StepStats
    # A field with a default may be missing from an older server's answer.
    given = {f.name: wire.stats[f.name] for f in fields(kind) if f.name in wire.stats}
    stats = kind(**given)  # type: ignore[arg-type]  # the wire's numbers, typed per field by kind
    checkpoint = Path(wire.checkpoint) if wire.checkpoint else None  # relative to the server's root
    staleness = Staleness(**wire.staleness) if wire.staleness is not None else None  # type: ignore[arg-type]
    return StepResult(
        wire.step,
        stats,
        checkpoint,
        wire.publish_seconds,
        wire.save_seconds,
        staleness,
        dict(wire.timings),
        dict(wire.rendering),
    )
