"""`rlcoach init`: the guide for coding agents it writes, and every snippet in it, run.

The files are written by the real command into a fresh folder; each python block of the
written AGENTS.md and SKILL.md is a complete script and runs here, in that folder, against
the bundled model, in order (the block that reads `metrics.jsonl` reads the run the first
block made). As tests/integration/test_examples.py runs the examples with `--steps 1
--engine transformers`, the blocks' two settings lines are set the same way: `ENGINE =
"vllm"` becomes `"transformers"` (a vLLM start per block would cost a minute each) and
`STEPS = 20` becomes 1; a block that starts a backend without the settings line fails the
test, so no snippet escapes the substitution. Every `rlcoach ...` line of a shell block is
checked against the real command tree: its sub-commands, options and arguments exist.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from rlcoach.cli import app

FENCED = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)
RLCOACH = str(Path(sys.executable).with_name("rlcoach"))
SETTINGS = {'ENGINE = "vllm"': 'ENGINE = "transformers"', "STEPS = 20": "STEPS = 1"}


def run_init(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [RLCOACH, "init", str(folder), *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("project")
    done = run_init(folder)
    assert done.returncode == 0, done.stderr
    return folder


def guide_texts(project: Path) -> dict[str, str]:
    return {
        name: (project / name).read_text()
        for name in ("AGENTS.md", ".claude/skills/rlcoach/SKILL.md")
    }


def fenced(text: str, language: str) -> list[str]:
    """The contents of the fenced blocks of `language` (the guide's fences are not indented)."""
    return [body for info, body in FENCED.findall(text) if info == language]


def blocks(project: Path, language: str) -> list[str]:
    return [b for text in guide_texts(project).values() for b in fenced(text, language)]


def test_init_writes_agents_md_and_a_skill(project):
    texts = guide_texts(project)
    skill = texts[".claude/skills/rlcoach/SKILL.md"]
    head, _, body = skill.removeprefix("---\n").partition("\n---\n")
    front = yaml.safe_load(head)
    assert set(front) == {"name", "description"}
    assert front["name"] == "rlcoach" == Path(".claude/skills/rlcoach").name  # the folder
    assert 0 < len(front["description"]) <= 1024
    assert body.lstrip().startswith("# ")
    assert ".claude/skills/rlcoach/SKILL.md" in texts["AGENTS.md"]  # it points at the skill
    assert oct((project / "AGENTS.md").stat().st_mode & 0o777) == oct(0o644)


def test_init_never_overwrites_silently(tmp_path):
    (tmp_path / "AGENTS.md").write_text("the user's own notes\n")
    done = run_init(tmp_path)
    assert done.returncode == 2
    assert "AGENTS.md already exists" in done.stderr and "--force" in done.stderr
    assert (tmp_path / "AGENTS.md").read_text() == "the user's own notes\n"
    assert not (tmp_path / ".claude").exists()  # nothing written when one file is in the way
    done = run_init(tmp_path, "--force", "--skill-dir", "skills/rlcoach")
    assert done.returncode == 0, done.stderr
    assert "skills/rlcoach/SKILL.md" in (tmp_path / "AGENTS.md").read_text()
    assert (tmp_path / "skills/rlcoach/SKILL.md").is_file()


def test_init_refuses_a_skill_folder_outside_the_project(tmp_path):
    done = run_init(tmp_path, "--skill-dir", "../elsewhere")
    assert done.returncode == 2
    assert "inside the project" in done.stderr


def _command(tokens: list[str]) -> tuple[Any, list[str]]:
    """The (click) command the tokens name, and the tokens after its name. Read by duck
    type: typer may carry its own copy of click's classes."""
    command = typer.main.get_command(app)
    rest = list(tokens)
    while hasattr(command, "commands") and rest and rest[0] in command.commands:
        command = command.commands[rest.pop(0)]
    return command, rest


def test_every_command_in_the_guide_exists(project):
    lines = [
        shlex.split(line, comments=True)
        for block in blocks(project, "bash")
        for line in block.splitlines()
        if line.strip().startswith("rlcoach ")
    ]
    assert len(lines) >= 5
    for tokens in lines:
        command, rest = _command(tokens[1:])
        options = {"--help"} | {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
        arguments = [p for p in command.params if p.param_type_name == "argument"]
        positional, expect_value = 0, False
        for token in rest:
            if token.startswith("--"):
                assert token in options, f"{shlex.join(tokens)}: {token} is not an option"
                param = next((p for p in command.params if token in p.opts), None)
                expect_value = param is not None and not getattr(param, "is_flag", False)
            elif expect_value:
                expect_value = False
            else:
                positional += 1
        assert positional <= len(arguments), f"{shlex.join(tokens)}: no such command or argument"


def test_every_python_snippet_uses_the_settings_lines(project):
    scripts = blocks(project, "python")
    assert len(scripts) >= 5
    for script in scripts:
        if "LocalBackend(" in script:
            assert 'ENGINE = "vllm"' in script and 'engine={"kind": ENGINE}' in script


def _scripts() -> list[str]:
    """The python blocks of the guide as shipped (ids for the parametrized run)."""
    from rlcoach.guide import guide_files

    return [b for f in guide_files() for b in fenced(f.text, "python")]


@pytest.mark.parametrize("index", range(len(_scripts())))
def test_python_snippet_runs(project, index):
    script = blocks(project, "python")[index]
    for written, here in SETTINGS.items():
        script = script.replace(written, here)
    path = project / f"snippet_{index}.py"
    path.write_text(script)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        [sys.executable, str(path)],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, f"{path.name}:\n{done.stderr[-4000:]}"
    assert done.stdout.strip(), f"{path.name} printed nothing"
