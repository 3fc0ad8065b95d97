"""Loading a `verifiers` environment as its author ships it, and reading its dataset.

An environment is a module with a `load_environment(**args)` function: an installed
package named by its id (`vf-gsm8k`, `my_env`) or a `.py` file / package folder on disk.
Nothing in it is edited; a failure to load is raised as `EnvironmentLoadError` with the
environment's own traceback chained (`raise ... from`), so the user sees their code's line.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from rlcoach.errors import ConfigError, MissingDependencyError

__all__ = ["EnvironmentLoadError", "load", "rows"]


class EnvironmentLoadError(ConfigError):
    """An environment that could not be imported or whose `load_environment` raised."""


def _verifiers() -> Any:
    try:
        import verifiers
    except ImportError as e:
        raise MissingDependencyError(
            f"rlcoach.integrations.verifiers needs the verifiers package ({e}); fix: pip "
            "install 'rlcoach[verifiers]' (see docs/environments.md for the pinned set)"
        ) from e
    return verifiers


def _module_from_path(path: Path) -> Any:
    file = path / "__init__.py" if path.is_dir() else path
    if not file.is_file():
        raise EnvironmentLoadError(
            f"environment {str(path)!r}: no {file.name} there; fix: name a .py file or a "
            "package folder that defines load_environment()"
        )
    name = f"rlcoach_env_{path.stem.replace('-', '_')}"
    spec = importlib.util.spec_from_file_location(
        name, file, submodule_search_locations=[str(path)] if path.is_dir() else None
    )
    assert spec is not None and spec.loader is not None  # a .py file always has both
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load(spec: str, env_args: dict[str, Any] | None = None) -> Any:
    """The `verifiers.Environment` that `spec`'s `load_environment(**env_args)` returns.

    `spec` is a path (a `.py` file or a package folder) or an installed module's id
    (`-` read as `_`, as `vf-eval` reads it)."""
    vf = _verifiers()
    env_args = dict(env_args or {})
    path = Path(spec)
    try:
        if path.suffix == ".py" or path.exists():
            module = _module_from_path(path)
        else:
            module = importlib.import_module(spec.replace("-", "_"))
    except EnvironmentLoadError:
        raise
    except Exception as e:
        raise EnvironmentLoadError(
            f"environment {spec!r} could not be imported: {type(e).__name__}: {e} (its "
            "traceback follows); fix: install it (`pip install <its package>`) or give the "
            "path of its .py file"
        ) from e
    factory = getattr(module, "load_environment", None)
    if not callable(factory):
        raise EnvironmentLoadError(
            f"environment {spec!r} ({getattr(module, '__file__', module)}) has no "
            "load_environment() function; fix: a verifiers environment defines "
            "`def load_environment(**kwargs) -> vf.Environment`"
        )
    try:
        env = factory(**env_args)
    except Exception as e:
        raise EnvironmentLoadError(
            f"environment {spec!r}: load_environment(**{env_args!r}) raised "
            f"{type(e).__name__}: {e} (its traceback follows)"
        ) from e
    if not isinstance(env, vf.Environment):
        raise EnvironmentLoadError(
            f"environment {spec!r}: load_environment() returned {type(env).__name__}, not a "
            "verifiers.Environment; fix: return the environment (vf.SingleTurnEnv(...), ...)"
        )
    env.env_id = env.env_id or spec
    return env


def rows(env: Any, split: str, n: int = -1, seed: int | None = None) -> list[dict[str, Any]]:
    """The dataset rows (verifiers' `RolloutInput`s) of `split`: "train" is the
    environment's dataset, "eval" its eval split (its dataset when it has none)."""
    if split not in ("train", "eval"):
        raise ConfigError(f"split={split!r} must be 'train' or 'eval'")
    has_train = env.dataset is not None or env.dataset_source is not None
    try:
        if split == "train" and has_train:
            dataset = env.get_dataset(n=n, seed=seed)
        else:  # verifiers falls back to the train split when there is no eval split
            dataset = env.get_eval_dataset(n=n, seed=seed)
        found = [dict(row) for row in dataset]
    except Exception as e:
        raise EnvironmentLoadError(
            f"environment {env.env_id!r}: its {split} dataset could not be built: "
            f"{type(e).__name__}: {e} (its traceback follows)"
        ) from e
    if not found:
        raise EnvironmentLoadError(
            f"environment {env.env_id!r} has no {split} rows; fix: give it a dataset"
        )
    return found
