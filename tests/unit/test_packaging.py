"""Import boundaries (DESIGN.md), no side effects on import, and the wheel's contents."""

import ast
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Folder -> the rlcoach subpackages its modules may import (core may import none of them).
ALLOWED = {
    "core": set(),
    "ruler": {"rlcoach.ruler"},
    "autorl": {"rlcoach.autorl"},
    "integrations": {"rlcoach.ruler", "rlcoach.autorl", "rlcoach.integrations"},
}
PLUGINS = {"rlcoach.ruler", "rlcoach.autorl", "rlcoach.integrations"}
OPTIONAL = {
    "vllm",
    "langgraph",
    "langchain_openai",
    "langchain_core",
    "mcp",
    "langfuse",
    "wandb",
    "verifiers",
    "datasets",
}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _imported_names(path: Path) -> set[str]:
    """Every dotted name a file imports, `from a.b import c` giving `a.b.c`."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _private_rlcoach_names(names: set[str]) -> set[str]:
    return {
        name
        for name in names
        if name.split(".")[0] == "rlcoach" and any(p.startswith("_") for p in name.split("."))
    }


# What a module of tests/ is importable as (pytest puts its folders on sys.path).
TEST_MODULES = {"tests"} | {p.stem for p in (ROOT / "tests").rglob("*.py")}


def _reaches_into_tests(path: Path) -> list[str]:
    """Imports of a tests/ module, and sys.path entries that name the tests folder."""
    found = [n for n in _imports(path) if n.split(".")[0] in TEST_MODULES]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and "path" in ast.unparse(node.func).split("."):
            strings = [c.value for c in ast.walk(node) if isinstance(c, ast.Constant)]
            found += [f"sys.path gets {s!r}" for s in strings if s == "tests"]
    return found


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_folders_import_only_what_design_allows(folder):
    for path in (ROOT / folder).rglob("*.py"):
        for name in _imports(path):
            plugin = next((p for p in PLUGINS if name == p or name.startswith(p + ".")), None)
            if plugin is not None:
                assert plugin in ALLOWED[folder], f"{path} imports {name}"
            if folder != "integrations":
                assert name.split(".")[0] not in OPTIONAL, f"{path} imports optional {name}"


def test_the_library_never_imports_a_private_name_of_another_module():
    # A helper several modules need lives in a shared module (e.g. rlcoach.runtime.processes)
    # under a public name; `from rlcoach.x import _helper` is a layer leak.
    leaks = []
    for folder in ALLOWED:
        for path in (ROOT / folder).rglob("*.py"):
            leaks += [
                f"{path.relative_to(ROOT)}: {n}"
                for n in _private_rlcoach_names(_imported_names(path))
            ]
    assert leaks == []


def test_examples_import_only_public_names_and_never_tests():
    # DESIGN.md: examples may import everything public, never a private `_name`, never tests/.
    paths = sorted((ROOT / "examples").rglob("*.py"))
    assert len(paths) > 10
    problems = []
    for path in paths:
        where = path.relative_to(ROOT)
        problems += [f"{where}: private {n}" for n in _private_rlcoach_names(_imported_names(path))]
        problems += [f"{where}: {found}" for found in _reaches_into_tests(path)]
    assert problems == []


def test_bench_does_not_reach_into_tests():
    paths = sorted((ROOT / "bench").rglob("*.py"))
    assert len(paths) > 5
    problems = [
        f"{path.relative_to(ROOT)}: {found}"
        for path in paths
        for found in _reaches_into_tests(path)
    ]
    assert problems == []


def test_the_boundary_checks_catch_what_they_look_for(tmp_path):
    leaky = tmp_path / "leaky.py"
    leaky.write_text(
        "import sys\n"
        "sys.path.insert(0, str(Path(__file__).parents[1] / 'tests'))\n"
        "from serve_process import ServeProcess\n"
        "from rlcoach.engines.vllm import _tail\n"
        "import rlcoach._hidden\n"
    )
    assert _private_rlcoach_names(_imported_names(leaky)) == {
        "rlcoach.engines.vllm._tail",
        "rlcoach._hidden",
    }
    assert sorted(_reaches_into_tests(leaky)) == ["serve_process", "sys.path gets 'tests'"]


def test_import_rlcoach_is_light_and_has_no_side_effects(tmp_path):
    code = (
        "import json, os, sys, logging; before = set(os.listdir('.'));"
        "import rlcoach;"
        "print(json.dumps({'modules': sorted(sys.modules), 'handlers':"
        " len(logging.getLogger().handlers), 'files': sorted(set(os.listdir('.')) - before)}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout
    report = json.loads(out)
    heavy = {"torch", "transformers", "peft", "vllm", "openai", *OPTIONAL}
    loaded = {m.split(".")[0] for m in report["modules"]}
    assert not heavy & loaded, f"import rlcoach loaded {sorted(heavy & loaded)}"
    assert report["handlers"] == 0
    assert report["files"] == []


def test_public_api_is_curated():
    import rlcoach

    assert sorted(rlcoach.__all__) == sorted(set(rlcoach.__all__))
    for name in rlcoach.__all__:
        assert hasattr(rlcoach, name), name


def test_wheel_holds_every_package_under_one_namespace(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--outdir",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("rlcoach-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in [
        "rlcoach/__init__.py",
        "rlcoach/py.typed",
        "rlcoach/trainer/objective.py",
        "rlcoach/engines/vllm.py",
        "rlcoach/demo/task.py",
        "rlcoach/cli.py",
        "rlcoach/guide/AGENTS.md",  # `rlcoach init` writes these two
        "rlcoach/guide/SKILL.md",
        "rlcoach/ruler/__init__.py",
        "rlcoach/autorl/__init__.py",
        "rlcoach/integrations/__init__.py",
    ]:
        assert expected in names, expected
    assert not any(n.startswith(("core/", "tests/", "bench/")) for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "rlcoach = rlcoach.cli:app" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_no_two_installed_distributions_write_the_same_module():
    """Two packages that ship one module (a fork and its original: `oss-harmony`, which
    vLLM needs, and `openai-harmony`, which a verifiers dependency asked for) overwrite
    each other's files, and whichever was installed last wins in silence. The set that
    `make` installs has no such pair."""
    import collections
    from importlib import metadata

    owners: dict[str, set[str]] = collections.defaultdict(set)
    for dist in metadata.distributions():
        for file in dist.files or []:
            path = str(file)
            if path.endswith((".py", ".so")) and not path.startswith(".."):
                owners[path].add(dist.metadata["Name"])
    shared = {path: sorted(names) for path, names in owners.items() if len(names) > 1}
    assert not shared, f"files written by two distributions: {sorted(shared.items())[:10]}"
