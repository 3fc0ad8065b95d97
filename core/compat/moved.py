"""Old import paths of modules that moved into rooms, kept for one release.

`core/` was regrouped into rooms by role (docs/architecture.md). Code written against
the flat layout (`from rlcoach.types import Trajectory`, `import rlcoach.gateway`) keeps
working: the finder below answers an old name with the module at its new place, the
same module object (so patching either name patches both), and warns once per name with
a `DeprecationWarning` that says what to write instead. `rlcoach.backend` and
`rlcoach.rollout` need no entry: they are rooms now, and re-export what the old modules
exported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

__all__ = ["MOVED", "install"]

MOVED: dict[str, str] = {
    "access": "serve.access",
    "answers": "models.answers",
    "art_config": "compat.art_config",
    "base_model": "models.base_model",
    "bundled": "models.bundled",
    "capture": "rollout.capture",
    "chat_template": "models.chat_template",
    "client_choices": "trajectory.client_choices",
    "colocation": "backend.colocation",
    "constraint": "endpoint.constraint",
    "dataset": "trajectory.dataset",
    "dev": "compat.dev",
    "distill": "backend.distill",
    "evaluation": "backend.evaluation",
    "failpoints": "runtime.failpoints",
    "families": "models.families",
    "fastjson": "engines.fastjson",
    "gateway": "endpoint.gateway",
    "gather": "rollout.gather",
    "hardware": "runtime.hardware",
    "heap": "runtime.heap",
    "memory": "runtime.memory",
    "pipeline": "backend.pipeline",
    "placement": "runtime.placement",
    "processes": "runtime.processes",
    "recorder": "endpoint.recorder",
    "recording": "trajectory.histories",
    "refusal": "serve.refusal",
    "registrations": "serve.registrations",
    "remote": "serve.remote",
    "report": "observe.report",
    "rescore": "endpoint.rescore",
    "retention": "backend.retention",
    "router": "endpoint.router",
    "serve_config": "serve.serve_config",
    "server": "serve.server",
    "sinks": "observe.sinks",
    "staleness": "rollout.staleness",
    "step_commit": "backend.step_commit",
    "step_records": "serve.step_records",
    "stream": "engines.stream",
    "supervisor": "backend.supervisor",
    "timeline": "trajectory.timeline",
    "training_input": "backend.training_input",
    "training_requests": "serve.training_requests",
    "types": "trajectory.trajectories",
    "usage": "models.usage",
    "wire": "serve.wire",
}
"""Old module name (under `rlcoach.`) -> its new dotted path (under `rlcoach.`)."""


class _MovedLoader(importlib.abc.Loader):
    def __init__(self, new_name: str) -> None:
        self._new_name = new_name
        self._own_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self._new_name}; import it from there "
            "(the old path goes away in the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(self._new_name)
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The module was executed at its new place; the import system has just set its
        # `__spec__` to the old name's, so it is given back its own.
        module.__spec__ = self._own_spec


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        prefix, _, old = fullname.partition(".")
        if prefix != "rlcoach" or old not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _MovedLoader(f"rlcoach.{MOVED[old]}"))


def install() -> None:
    """Put the finder on `sys.meta_path` once (imported by `rlcoach/__init__.py`)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
