"""Models: the policy being trained, and plain models served elsewhere.

`Model` is anything behind an OpenAI-compatible URL (a judge, a baseline, a hosted API;
its key is read from the environment variable you name, never stored; providers.py
builds one from a `provider/model` string). `TrainableModel` is the policy: a name, a
project, a base model (a shipped name, a folder or a hub id, base_model.py) and a training
config. Once registered with a backend it is served as `name@step` (and as `name`, its
latest step); `openai_client()` points at the backend's policy endpoint, `rollout()`
opens a recording scope, `train()` runs a step, `log()` records evaluation groups and
`delete_checkpoints()` prunes old steps — the last three as ART spells them.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

import httpx
from pydantic import BaseModel

from rlcoach.compat.art_config import internal_config, train_options
from rlcoach.config import SFTConfig, TrainConfig, check_name, parse_config
from rlcoach.endpoint.gateway import EVALUATION_HEADER, ROLLOUT_HEADER
from rlcoach.errors import ConfigError
from rlcoach.models.base_model import parse_hub_id
from rlcoach.models.bundled import BUNDLED_MODEL
from rlcoach.models.served_name import ServedName
from rlcoach.rollout.capture import CapturedRollout, ClientRecorder
from rlcoach.rollout.scope import Rollout, current_rollout_id, evaluating
from rlcoach.rollout.teacher import Teacher
from rlcoach.trajectory.trajectories import ChatRecord, Scalar, Trajectory, TrajectoryGroup

if TYPE_CHECKING:
    from openai import AsyncOpenAI

    from rlcoach.backend.local import Backend, StepResult

__all__ = ["Model", "PendingStep", "TrainableModel"]

T = TypeVar("T")


def _tag_rollout_sync(request: httpx.Request) -> None:
    rollout_id = current_rollout_id()
    if rollout_id is not None and ROLLOUT_HEADER not in request.headers:
        request.headers[ROLLOUT_HEADER] = rollout_id
        if evaluating():
            request.headers[EVALUATION_HEADER] = "1"


async def _tag_rollout(request: httpx.Request) -> None:
    _tag_rollout_sync(request)


class Model:
    """A model served behind an OpenAI-compatible endpoint."""

    def __init__(
        self,
        name: str,
        *,
        base_url: str | None = None,
        api_key_env: str | None = None,
        timeout_s: float = 600.0,
        max_retries: int = 2,
        project: str | None = None,
        inference_base_url: str | None = None,
        inference_model_name: str | None = None,
        inference_api_key: str | None = None,
    ) -> None:
        """`project`, `inference_base_url` and `inference_model_name` are ART's spellings
        (the last two of `base_url` and the name requests carry); a key is never taken
        as a value — name its environment variable in `api_key_env`."""
        if not isinstance(name, str) or not name:
            raise ConfigError(f"model name {name!r} must be a non-empty string")
        if inference_api_key is not None:
            raise ConfigError(
                f"model {name!r} was given its API key as a value (ART's inference_api_key); "
                "rlcoach reads keys from the environment when a request is made and never "
                "keeps them; fix: pass api_key_env='OPENAI_API_KEY' (the variable's name), or "
                "name the model as 'provider/model' where a judge is taken"
            )
        self.name = inference_model_name or name
        self.project = project
        self.base_url = base_url or inference_base_url
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self._recorder = ClientRecorder()

    @property
    def served_name(self) -> str:
        """The name to put in a request's `model` field."""
        return self.name

    def get_inference_name(self) -> str:
        """The name to put in a request's `model` field (ART's name for it): a trainable
        model's plain name, which always means its latest step."""
        return self.name

    @property
    def trainable(self) -> bool:
        return False

    def _endpoint(self) -> str:
        if self.base_url is None:
            raise ConfigError(
                f"model {self.name!r} has no base_url; fix: Model({self.name!r}, "
                "base_url='https://host/v1', api_key_env='MY_API_KEY')"
            )
        return self.base_url

    def _api_key(self) -> str:
        if self.api_key_env is None:
            # A model behind an `rlcoach serve` this process talks to (e.g. a judge on the
            # policy endpoint's base weights) gets that server's key; any other URL, none.
            from rlcoach.runtime.server_keys import CONNECTED_SERVERS

            return CONNECTED_SERVERS.key_for(self.base_url) or "none"
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ConfigError(
                f"model {self.name!r} reads its API key from ${self.api_key_env}, which is not "
                f"set; fix: export {self.api_key_env}=... before running"
            )
        return key

    @property
    def api_base(self) -> str:
        """The OpenAI-compatible base URL (`.../v1`) requests go to."""
        return self._endpoint()

    @property
    def api_key(self) -> str:
        """The key to send (read from the environment now; `none` when not needed)."""
        return self._api_key()

    def http_client(self, *, record: bool = True) -> httpx.AsyncClient:
        """The httpx client behind `openai_client()`: tags calls with the current rollout
        (and, inside this model's own `rollout()` scope, keeps its chat completions)."""
        if not record:
            return httpx.AsyncClient(**self._http_options([]))
        options = self._http_options([_tag_rollout, self._recorder.on_request])
        options["event_hooks"]["response"] = [self._recorder.on_response]
        return httpx.AsyncClient(**options)

    def sync_http_client(self, *, record: bool = True) -> httpx.Client:
        """The same for synchronous callers (a LangChain `invoke` in a worker thread)."""
        return httpx.Client(**self._http_options([_tag_rollout_sync] if record else []))

    def _http_options(self, hooks: list[Any]) -> dict[str, Any]:
        return {
            "event_hooks": {"request": hooks},
            "timeout": httpx.Timeout(self.timeout_s),
            "limits": httpx.Limits(max_connections=256, max_keepalive_connections=64),
        }

    def rollout(self, *, evaluation: bool = False, **metadata: Scalar) -> Rollout:
        """A scope whose chat completions through this model's async clients become one
        trajectory, as messages (a model outside the policy endpoint has no sampled
        tokens to keep): a teacher's demonstrations for `distill`, say."""
        return CapturedRollout(self._recorder, evaluation=evaluation, **metadata)

    def openai_client(self, *, record: bool = True, **kwargs: Any) -> AsyncOpenAI:
        """An `AsyncOpenAI` for this model; calls inside a rollout scope are recorded.

        `record=False` gives a client whose calls are never recorded, for callers such as
        a judge that must not land in the trajectory they are scoring.
        """
        from openai import AsyncOpenAI

        return AsyncOpenAI(
            base_url=self._endpoint(),
            api_key=self._api_key(),
            max_retries=self.max_retries,
            timeout=self.timeout_s,
            http_client=self.http_client(record=record),  # type: ignore[arg-type]  # openai's stubs name their own httpx
            **kwargs,
        )


def _train_config(config: Any) -> TrainConfig:
    if isinstance(config, BaseModel) and not isinstance(config, TrainConfig):
        raise ConfigError(
            f"config={type(config).__name__}(...) is not a TrainConfig: in rlcoach a "
            "model's `config` is its training config (ART's `config=` holds your own "
            "settings); fix: keep your settings in a variable of your own and pass "
            "config=TrainConfig(...) (or a dict of its fields, or nothing)"
        )
    return parse_config(TrainConfig, config)


class PendingStep:
    """A training step running in the background (`model.train(groups, wait=False)`).

    `await pending` (or `await pending.result()`) returns its `StepResult` or raises its
    error. A model's steps run one after another in the order they were started, so
    rollouts can go on while a step trains and the next step queues behind it.
    """

    def __init__(self, task: asyncio.Task[StepResult], step: int) -> None:
        self._task = task
        self.started_from = step
        """The model's step when this one was started (it trains from that version or a
        later one, if steps queued before it)."""

    def done(self) -> bool:
        return self._task.done()

    def __await__(self) -> Generator[Any, None, StepResult]:
        return self._task.__await__()

    async def result(self) -> StepResult:
        return await self._task


class TrainableModel(Model):
    """The policy: base model + the LoRA that training produces, served as `name@step`."""

    project: str
    """The project's name (a folder of the run root); a plain `Model` may have none."""

    def __init__(
        self,
        name: str,
        project: str,
        base_model: str = BUNDLED_MODEL,
        config: TrainConfig | dict[str, Any] | None = None,
        *,
        revision: str | None = None,
        _internal_config: Mapping[str, Any] | None = None,
    ) -> None:
        """`base_model`: a shipped model's name, a local folder, or a Hugging Face hub id
        (`org/name`, `org/name@rev`; `revision` is the same as the `@rev` suffix).
        `_internal_config`: ART's dict of engine, LoRA and trainer knobs (art_config.py)."""
        super().__init__(check_name("model", name))
        self.project = check_name("project", project)
        ref = parse_hub_id(base_model, revision) if isinstance(base_model, str) else None
        if revision is not None and ref is None:
            raise ConfigError(
                f"revision={revision!r} was given for base model {base_model!r}, which is "
                "not a hub id; fix: drop revision, or name a hub model like 'org/name'"
            )
        self.base_model = str(ref) if ref is not None and ref.revision else base_model
        """The base model as the backend resolves it (a hub id carries its `@revision`)."""
        self.config = _train_config(config)
        self.engine_overrides: dict[str, Any] = {}
        """`EngineConfig` fields this model asks of the engine (from `_internal_config`);
        a `LocalBackend` applies them when it starts the engine for this model."""
        self.step = 0
        self._backend: Backend | None = None
        self._last_step: asyncio.Task[Any] | None = None
        self._art_internal: Mapping[str, Any] | None = None
        if _internal_config is not None:
            self._internal_config = _internal_config

    @property
    def _internal_config(self) -> Mapping[str, Any] | None:
        """ART's `_internal_config`, as given (its translation is already applied)."""
        return self._art_internal

    @_internal_config.setter
    def _internal_config(self, value: Mapping[str, Any] | None) -> None:
        translated = internal_config(value)
        if translated.lora or translated.train:
            fields = self.config.model_dump()
            fields.update(translated.train)
            fields["lora"] = {**fields["lora"], **translated.lora}
            self.config = parse_config(TrainConfig, fields)
        self.engine_overrides = translated.engine
        self._art_internal = value

    @property
    def trainable(self) -> bool:
        return True

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            raise ConfigError(
                f"model {self.name!r} is not registered with a backend; fix: "
                "`await model.register(LocalBackend())` first"
            )
        return self._backend

    @property
    def served_name(self) -> str:
        return str(ServedName(self.name, self.step))

    def _endpoint(self) -> str:
        return self.backend.url + "/v1"

    def _api_key(self) -> str:
        return self.backend.api_key

    async def register(self, backend: Backend) -> None:
        """Serve this model on `backend` (resuming from its latest checkpoint)."""
        await backend.register(self)
        self._backend = backend

    async def get_step(self) -> int:
        """The model's current step (ART's spelling; `model.step` holds the same)."""
        return self.step

    def rollout(self, *, evaluation: bool = False, **metadata: Scalar) -> Rollout:
        """A scope whose policy calls become one trajectory; `evaluation=True` for one
        that is measured, never trained on (a held-out split: see rollout/scope.py)."""
        return Rollout(self.backend, evaluation=evaluation, **metadata)

    def _queued(self, start: Callable[[], Awaitable[T]]) -> asyncio.Task[T]:
        """Run `start()` after the model's earlier steps, as a task (steps never overlap
        each other; rollouts may overlap them)."""
        previous = self._last_step

        async def run() -> T:
            if previous is not None and not previous.done():
                await asyncio.wait([previous])  # its error belongs to its own caller
            return await start()

        task = asyncio.create_task(run(), name=f"rlcoach-train-{self.name}")
        self._last_step = task
        return task

    @overload
    async def train(
        self,
        groups: Iterable[TrajectoryGroup],
        config: TrainConfig | dict[str, Any] | None = None,
        _config: Mapping[str, Any] | None = None,
        verbose: bool = False,
        *,
        wait: Literal[True] = True,
        teacher: Teacher | None = None,
    ) -> StepResult: ...

    @overload
    async def train(
        self,
        groups: Iterable[TrajectoryGroup],
        config: TrainConfig | dict[str, Any] | None = None,
        _config: Mapping[str, Any] | None = None,
        verbose: bool = False,
        *,
        wait: Literal[False],
        teacher: Teacher | None = None,
    ) -> PendingStep: ...

    async def train(
        self,
        groups: Iterable[TrajectoryGroup],
        config: TrainConfig | dict[str, Any] | None = None,
        _config: Mapping[str, Any] | None = None,
        verbose: bool = False,
        *,
        wait: bool = True,
        teacher: Teacher | None = None,
    ) -> StepResult | PendingStep:
        """One training step on `groups`; the new adapter is served when it finishes.

        `wait=False` returns a `PendingStep` at once, so the caller can keep sampling
        (with the current version) while the step trains; `pipeline.py` builds the
        async loop on it. Samples staler than `TrainConfig.max_staleness` versions when
        the step starts are dropped and counted (staleness.py).

        `teacher`: on-policy distillation (rollout/teacher.py, docs/distillation.md):
        before the step, the teacher scores every token the student sampled, and each
        token's advantage gets `teacher_coef * (teacher - sampler)` log-prob on top of
        `reward_coef` x the group-relative reward advantage.

        `_config` takes ART's per-step options (`logprob_calculation_chunk_size`,
        `epsilon`, ...; art_config.py); `verbose` is accepted for ART's sake.
        """
        groups = list(groups)
        for group in groups:
            if isinstance(group, TrajectoryGroup) and group.pending:
                raise ConfigError(
                    "a TrajectoryGroup given to train still holds rollouts that have not run; "
                    "fix: train on what `await gather_trajectory_groups(...)` returns"
                )
        if _config:
            base = parse_config(TrainConfig, config) if config is not None else self.config
            config = parse_config(TrainConfig, {**base.model_dump(), **train_options(_config)})
        backend = self.backend

        async def step() -> StepResult:
            if teacher is not None:
                await teacher.score(self, groups)
            return await backend.train(self, groups, config)

        pending = PendingStep(self._queued(step), self.step)
        return await pending if wait else pending

    async def log(
        self,
        trajectories: Iterable[Trajectory | BaseException] | Iterable[TrajectoryGroup],
        split: str = "val",
        *,
        metrics: Mapping[str, float] | None = None,
        step: int | None = None,
    ) -> None:
        """Record groups that are not trained on (a validation set, say) with their
        numbers, at the current step (or `step`), to every sink and the report; see
        evaluation.py. `metrics`: more numbers for the record (named `<split>/<key>`)."""
        log = getattr(self.backend, "log", None)
        if log is None:
            raise ConfigError(
                f"the {type(self.backend).__name__} of model {self.name!r} cannot record "
                "evaluations yet; fix: record them with a LocalBackend, or score them "
                "yourself and keep the groups with save_groups(path, groups)"
            )
        from rlcoach.trajectory.splits import as_groups, check_split

        await log(
            self,
            as_groups(trajectories),
            check_split(split),
            metrics=metrics,
            step=self.step if step is None else step,
        )

    async def delete_checkpoints(
        self,
        best_checkpoint_metric: str = "val/reward",
        *,
        keep_last: int = 1,
        keep_best: int = 1,
        best_mode: Literal["max", "min"] = "max",
    ) -> list[int]:
        """Delete old checkpoints, keeping the latest (always), the `keep_last` newest and
        the `keep_best` best by `best_checkpoint_metric` (a number in the run's metrics,
        e.g. "val/reward" from `log()`); returns the deleted steps."""
        return await self.backend.delete_checkpoints(
            self,
            best_checkpoint_metric,
            keep_last=keep_last,
            keep_best=keep_best,
            best_mode=best_mode,
        )

    async def restore(self, step: int) -> int:
        """Serve checkpoint `step` as the model's latest again: a new step whose adapter and
        optimizer state are that checkpoint's (keep the best by validation, say); returns
        the new step. Later steps train on from it."""
        restore = getattr(self.backend, "restore", None)
        if restore is None:
            raise ConfigError(
                f"the {type(self.backend).__name__} of model {self.name!r} cannot restore a "
                "checkpoint yet; fix: restore with a LocalBackend where the model's files are"
            )
        return await self._queued(lambda: restore(self, step))

    async def train_sft(
        self,
        data: Sequence[Trajectory | ChatRecord],
        config: SFTConfig | dict[str, Any] | None = None,
        *,
        progress: bool = False,
    ) -> StepResult:
        """Supervised fine-tuning on `data` (trajectories or chat records) as one step:
        the new adapter is the next checkpoint and is served when this returns."""
        train_sft = getattr(self.backend, "train_sft", None)
        if train_sft is None:
            raise ConfigError(
                f"the {type(self.backend).__name__} of model {self.name!r} cannot run SFT; "
                "fix: run it where the model's files are, with a LocalBackend or `rlcoach "
                "sft <file.jsonl>` (the checkpoint it writes is the model's next step)"
            )
        return await self._queued(lambda: train_sft(self, data, config, progress=progress))
