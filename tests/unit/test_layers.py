"""The rooms of `core/` and the order they import in (docs/architecture.md), read from
the source; and what plugins and examples may import from the core.

A room may import itself and the rooms below it, never one above. Imports under
`if TYPE_CHECKING:` are annotations only and are not counted: the backend is typed
against `TrainableModel` without importing it at run time.
"""

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "core"

# Lowest first. Rooms in one tuple share a level and do not import each other.
LAYERS: list[tuple[str, ...]] = [
    ("foundation",),  # errors, validation, config, paths
    ("runtime", "compat", "guide"),
    ("models",),
    ("trajectory",),
    ("engines",),
    ("trainer",),
    ("endpoint",),
    ("rollout",),
    ("observe",),
    ("handle",),  # model.py (TrainableModel, Model) and providers.py
    ("backend",),
    ("serve",),
    ("demo",),
    ("face",),  # __init__ (the public API) and cli
]
ROOT_MODULES = {
    "errors": "foundation",
    "validation": "foundation",
    "config": "foundation",
    "paths": "foundation",
    "model": "handle",
    "providers": "handle",
    "__init__": "face",
    "cli": "face",
}
LEVEL = {room: level for level, rooms in enumerate(LAYERS) for room in rooms}

# Upward imports that are deliberate, each with its reason.
EXCEPTIONS = {
    ("trajectory.trajectories", "rollout.gather"): "awaiting a TrajectoryGroup of pending "
    "rollouts (ART's idiom) runs them through gather, imported when awaited",
}


def _room(dotted: str) -> str | None:
    """The room of a module named relative to `rlcoach` ("endpoint.gateway" -> endpoint)."""
    head = dotted.split(".")[0]
    if head in ROOT_MODULES:
        return ROOT_MODULES[head]
    if (CORE / head).is_dir():
        return head
    return None  # a plugin (ruler, autorl, integrations): the boundary test's business


def _runtime_imports(tree: ast.AST) -> list[str]:
    typing_only = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only |= {id(child) for child in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "rlcoach":  # `from rlcoach import errors` names a module
                found += [f"rlcoach.{a.name}" for a in node.names if _room(a.name)]
            else:
                found.append(node.module)
    return [name for name in found if name.startswith("rlcoach.")]


def _core_modules() -> list[tuple[str, Path]]:
    modules = []
    for path in sorted(CORE.rglob("*.py")):
        parts = path.relative_to(CORE).with_suffix("").parts
        modules.append((".".join(parts), path))
    return modules


def test_every_module_of_core_is_in_a_room():
    for dotted, _ in _core_modules():
        room = _room(dotted)
        assert room in LEVEL, f"core/{dotted.replace('.', '/')}.py is in no room of LAYERS"


def test_rooms_import_only_rooms_below_them():
    upward = []
    for dotted, path in _core_modules():
        here = _room(dotted)
        for name in _runtime_imports(ast.parse(path.read_text(), str(path))):
            target = name.removeprefix("rlcoach.")
            there = _room(target)
            if there is None or there == here or LEVEL[there] < LEVEL[here]:
                continue
            if any(dotted == a and target.startswith(b) for a, b in EXCEPTIONS):
                continue
            upward.append(f"{dotted} ({here}) imports {target} ({there})")
    assert upward == []


def test_each_room_says_what_it_is_for_and_what_it_may_import():
    for room in sorted({r for rooms in LAYERS for r in rooms} & {p.name for p in CORE.iterdir()}):
        doc = ast.get_docstring(ast.parse((CORE / room / "__init__.py").read_text()))
        assert doc and "May import" in doc, f"core/{room}/__init__.py: say what it may import"


def test_the_root_keeps_at_most_eight_modules():
    assert len(list(CORE.glob("*.py"))) <= 8


def _public_names(module: str) -> set[str]:
    return set(getattr(importlib.import_module(module), "__all__", ()))


def _core_names_imported(path: Path) -> list[tuple[str, str]]:
    """(module, name) for every `from rlcoach.<core module> import name` in a file."""
    pairs = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            module = node.module
            if module.startswith("rlcoach") and _room(
                module.removeprefix("rlcoach.") or "__init__"
            ):
                pairs += [(module, alias.name) for alias in node.names]
    return pairs


@pytest.mark.parametrize("folder", ["integrations", "ruler", "autorl", "examples"])
def test_plugins_and_examples_import_only_public_names_of_the_core(folder):
    hidden = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for module, name in _core_names_imported(path):
            target = f"{module}.{name}"
            try:  # `from rlcoach.trainer import lora` imports a module, which is public
                importlib.import_module(target)
                continue
            except ImportError:
                pass
            if name not in _public_names(module):
                hidden.append(f"{path.relative_to(ROOT)}: {target}")
    assert hidden == []


def test_the_layer_check_catches_an_upward_import(tmp_path):
    module = tmp_path / "leak.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "from rlcoach.serve.wire import TrainRequest\n"
        "if TYPE_CHECKING:\n"
        "    from rlcoach.backend.local import LocalBackend\n"
    )
    names = _runtime_imports(ast.parse(module.read_text()))
    assert names == ["rlcoach.serve.wire"]
    assert LEVEL[_room("serve.wire")] > LEVEL[_room("endpoint.gateway")]


def test_old_flat_import_paths_still_work_and_say_where_to_go():
    import warnings

    import rlcoach
    from rlcoach.compat.moved import MOVED

    for old, new in MOVED.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = importlib.import_module(f"rlcoach.{old}")
        assert module is importlib.import_module(f"rlcoach.{new}")
        assert module.__name__ == module.__spec__.name == f"rlcoach.{new}"
        assert any(f"rlcoach.{new}" in str(w.message) for w in caught), old
    from rlcoach.backend import LocalBackend, StepResult  # rooms now, same names as before
    from rlcoach.rollout import Rollout, current_rollout_id

    assert (LocalBackend, Rollout, current_rollout_id, StepResult) == (
        rlcoach.LocalBackend,
        rlcoach.Rollout,
        rlcoach.current_rollout_id,
        rlcoach.StepResult,
    )


def test_nothing_in_the_repository_imports_an_old_flat_path():
    from rlcoach.compat.moved import MOVED

    old = {f"rlcoach.{name}" for name in MOVED}
    found = []
    for folder in ["core", "ruler", "autorl", "integrations", "examples", "bench", "tests"]:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for name in _runtime_imports(ast.parse(path.read_text(), str(path))):
                if any(name == o or name.startswith(o + ".") for o in old):
                    found.append(f"{path.relative_to(ROOT)}: {name}")
    assert found == []
