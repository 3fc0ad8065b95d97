"""Registrations: the models `rlcoach serve` serves, kept across restarts.

A client registers a model (`POST /rlcoach/v1/models`, idempotent; a training or log
request registers its model too). `Registrations.register` builds the `TrainableModel`,
registers it with the backend (which resumes it from its latest complete checkpoint),
and writes its `ModelRef` to `registration.json` in the model's run folder (atomically).
At start-up `register_again` registers every model found that way, each at its latest
committed step, so its chats answer at once after a restart instead of 404 until a
client registers or trains it; a registration that no longer works is logged, not fatal.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from rlcoach.backend.local import LocalBackend
from rlcoach.errors import ConfigError, RLCoachError
from rlcoach.model import TrainableModel
from rlcoach.paths import RunPaths, write_text_atomic
from rlcoach.serve.refusal import Refusal
from rlcoach.serve.wire import ModelRef

__all__ = ["REGISTRATION", "Registrations"]

logger = logging.getLogger(__name__)

REGISTRATION = "registration.json"
"""A registered model's `ModelRef`, in its run folder: registered again at start-up."""


class Registrations:
    """The registered models by name, and their registration files under `root`."""

    def __init__(
        self,
        backend: LocalBackend,
        root: Path,
        run_paths: Callable[[str, str], RunPaths],
    ) -> None:
        self.backend = backend
        self.root = root
        self._run_paths = run_paths
        """The run folder of (project, name), names checked (a bad one: `Refusal`)."""
        self.models: dict[str, TrainableModel] = {}
        self._lock = asyncio.Lock()

    async def register(self, ref: ModelRef) -> TrainableModel:
        """The model `ref` names, registered now unless it already is (409 when its name
        is taken by another project, 400 when the backend refuses it)."""
        async with self._lock:
            known = self.models.get(ref.name)
            if known is not None:
                if known.project != ref.project:
                    raise Refusal(
                        409,
                        f"model {ref.name!r} is registered under project "
                        f"{known.project!r}, not {ref.project!r}; fix: use another "
                        "model name",
                        code="name_taken",
                    )
                return known
            try:
                model = TrainableModel(ref.name, ref.project, ref.base_model, ref.config)
                await self.backend.register(model)
            except ConfigError as e:
                raise Refusal(400, str(e), code="invalid_model") from e
            self.models[ref.name] = model
            record = self._run_paths(ref.project, ref.name).dir / REGISTRATION
            await asyncio.to_thread(write_text_atomic, record, ref.model_dump_json())
            return model

    async def register_again(self) -> None:
        """Every model registered before a restart, registered again (see the module
        docstring); one that fails is logged and skipped."""
        for file in sorted(self.root.glob(f"*/*/{REGISTRATION}")):
            try:
                ref = ModelRef.model_validate_json(await asyncio.to_thread(file.read_bytes))
                await self.register(ref)
            except (OSError, ValueError, RLCoachError) as e:
                logger.warning("model %s is not registered again after the restart: %s", file, e)
