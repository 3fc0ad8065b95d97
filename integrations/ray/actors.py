"""The Ray actors of a run: inference replicas and the trainer, each core's own assembly.

`InferenceReplica` is a `LocalBackend` started in the actor's process: the engine the
`EngineConfig` names (vLLM, or transformers on CPUs) and rlcoach's gateway in front of it
(router, recorder), assembled by core exactly as on one host. It listens on
`EngineConfig.host`; with 0.0.0.0 it reports its node's address. New adapters arrive as
the bytes of the checkpoint's files (through Ray's object store, so a replica on another
node needs no shared disk), are written under the replica's folder and published to its
router.

`TrainerActor` is a `LocalBackend` whose engine serves nothing (`TrainerSideEngine`): the
trainer, the step and its commit point are core's (`LocalBackend.train`), the
checkpoints under the run root as on one host, and a step commits once its adapter
folder is complete. The driver then sends the adapter's bytes to every replica. A new
trainer actor (after one died) resumes from the latest committed step, as
`LocalBackend.register` does.

Importing this module does not import Ray: the backend wraps these classes with
`ray.remote` when it starts them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from rlcoach.backend.local import LocalBackend, StepResult
from rlcoach.config import EngineConfig, TrainConfig
from rlcoach.engines.base import Engine
from rlcoach.errors import EngineError
from rlcoach.model import TrainableModel
from rlcoach.trajectory.exchange import Exchange
from rlcoach.trajectory.trajectories import TrajectoryGroup

__all__ = ["InferenceReplica", "ModelSpec", "TrainerActor", "TrainerSideEngine", "adapter_files"]

ModelSpec = dict[str, Any]
"""A `TrainableModel` as plain data: name, project, base_model, config, engine_overrides."""


def model_spec(model: TrainableModel) -> ModelSpec:
    return {
        "name": model.name,
        "project": model.project,
        "base_model": model.base_model,
        "config": model.config.model_dump(mode="json"),
        "engine_overrides": dict(model.engine_overrides),
    }


def model_from_spec(spec: ModelSpec, step: int = 0) -> TrainableModel:
    model = TrainableModel(spec["name"], spec["project"], spec["base_model"], spec["config"])
    model.engine_overrides = dict(spec.get("engine_overrides") or {})
    model.step = step
    return model


def adapter_files(folder: Path) -> dict[str, bytes]:
    """The files a replica needs to serve the adapter in `folder` (not the optimizer)."""
    return {
        p.name: p.read_bytes()
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name.startswith("adapter_")
    }


def _node_address() -> str:
    import ray

    return str(ray.util.get_node_ip_address())


class InferenceReplica:
    """One policy endpoint (engine + gateway) in a Ray actor."""

    def __init__(self, replica_id: str, root: str, engine: dict[str, Any]) -> None:
        self.replica_id = replica_id
        self.folder = Path(root) / "replicas" / replica_id
        self.backend = LocalBackend(self.folder, engine=engine)

    async def start(self, base_model: str) -> dict[str, Any]:
        """Start the engine and the gateway; return the url others reach it at."""
        await self.backend.start(base_model)
        gateway = self.backend.gateway
        assert gateway is not None
        host = self.backend.engine_config.host
        if host in ("0.0.0.0", "::"):
            host = _node_address()
        return {"url": f"http://{host}:{gateway.port}", "pid": os.getpid()}

    async def serve_model(self, name: str) -> None:
        """Know model `name` (its step 0: the base weights)."""
        gateway = self.backend.gateway
        assert gateway is not None
        if name not in gateway.router.latest:
            gateway.router.register(name, 0, {})

    async def publish(self, name: str, step: int, files: dict[str, bytes]) -> float:
        """Write the adapter's files and serve them as `name@step`, now `name`'s latest."""
        gateway = self.backend.gateway
        assert gateway is not None
        folder = self.folder / "adapters" / name / str(step)
        partial = folder.with_name(f".{step}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        for file_name, data in files.items():
            (partial / file_name).write_bytes(data)
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
        await self.serve_model(name)
        return await gateway.call(gateway.router.publish(name, step, folder))

    async def take(self, rollout_id: str) -> list[Exchange]:
        return await self.backend.take_exchanges(rollout_id)

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        """The Ray node this replica runs on (hex id)."""
        import ray

        return str(ray.get_runtime_context().get_node_id())

    async def close(self) -> None:
        await self.backend.close()


class TrainerSideEngine:
    """The engine of the trainer actor's `LocalBackend`: it serves no requests (the
    replicas do), and a publish checks that the adapter folder is complete, so a step
    commits only with an adapter the replicas can load."""

    def __init__(self, base_name: str) -> None:
        self.base_name = base_name

    async def start(self) -> None:
        return None

    def _refuse(self) -> EngineError:
        return EngineError(
            "the trainer actor serves no requests; fix: send them to RayBackend.url "
            "(the entry point in front of the inference replicas)"
        )

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        raise self._refuse()

    async def chat_stream(self, body: dict[str, Any]) -> Any:
        raise self._refuse()

    async def token_logprobs(self, model: str, token_ids: list[int], start: int) -> list[float]:
        raise self._refuse()

    async def detokenize(self, model: str, token_ids: list[int]) -> str:
        raise self._refuse()

    async def load_adapter(self, served_name: str, path: Path) -> None:
        missing = [n for n in ("adapter_config.json",) if not (path / n).is_file()]
        if missing or not adapter_files(path):
            raise EngineError(f"adapter folder {path} lacks {missing or 'its weights'}")

    async def unload_adapter(self, served_name: str) -> None:
        return None

    async def healthy(self) -> bool:
        return True

    async def close(self) -> None:
        return None


class _TrainerBackend(LocalBackend):
    def _make_engine(self, model_path: Path, base_name: str) -> Engine:
        return TrainerSideEngine(base_name)


class TrainerActor:
    """The trainer in a Ray actor: `LocalBackend`'s step and commit point (see module)."""

    def __init__(self, root: str, engine: dict[str, Any]) -> None:
        # The replicas' engine config: its chat template and context bound training input.
        self.backend = _TrainerBackend(root, engine=EngineConfig(**engine))
        self.models: dict[str, TrainableModel] = {}

    async def register(self, spec: ModelSpec) -> int:
        """Register the model (resuming from its latest committed step); return its step."""
        model = model_from_spec(spec)
        await self.backend.register(model)
        self.models[model.name] = model
        return model.step

    async def train(
        self,
        name: str,
        groups: list[TrajectoryGroup],
        config: dict[str, Any] | None,
        request_id: str | None,
    ) -> tuple[StepResult, dict[str, bytes]]:
        """One step; its result and the new adapter's files (empty if nothing trained)."""
        model = self.models[name]
        train_config = TrainConfig(**config) if config is not None else None
        result = await self.backend.train(model, groups, train_config, request_id=request_id)
        files = adapter_files(result.checkpoint) if result.checkpoint is not None else {}
        return result, files

    def latest_adapter(self, name: str) -> tuple[int, dict[str, bytes]]:
        """The model's latest committed step and its adapter's files ({} at step 0)."""
        model = self.models[name]
        latest = self.backend.paths(model).latest_checkpoint()
        if latest is None:
            return 0, {}
        return latest[0], adapter_files(latest[1])

    def pid(self) -> int:
        return os.getpid()

    async def close(self) -> None:
        await self.backend.close()
