"""A guide for coding agents (`rlcoach init`): AGENTS.md and a SKILL.md, written into a project.

A coding agent working in a user's project reads `AGENTS.md` at the project's root and
the skills under `.claude/skills/` (or wherever the user puts them); `write_guide`
writes both from the two files beside this module. The skill is in the common SKILL.md
form: YAML front matter with `name` (lower case and hyphens, the same as its folder) and
a `description` saying when to use it, then the guide. Every python block in them is a
complete script that the tests run against the bundled model, so the guide only names
APIs that exist.

May import: the root foundation (errors, paths). Never imports: any other room (the CLI
imports it).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from rlcoach.errors import UsageError
from rlcoach.paths import write_text_atomic

__all__ = ["SKILL_FOLDER", "GuideFile", "guide_files", "write_guide"]

SKILL_FOLDER = Path(".claude/skills/rlcoach")
"""Where the skill goes in a project, by default (Claude Code's place; other agents
read the same SKILL.md form from their own folder: pass `skill_dir`)."""


@dataclass(frozen=True, slots=True)
class GuideFile:
    """One file of the guide: its path inside the project and its text."""

    path: Path
    text: str


def _template(name: str) -> str:
    return files("rlcoach.guide").joinpath(name).read_text(encoding="utf-8")


def guide_files(skill_dir: Path = SKILL_FOLDER) -> list[GuideFile]:
    """The files `rlcoach init` writes, with paths relative to the project folder."""
    if skill_dir.is_absolute() or ".." in skill_dir.parts:
        raise UsageError(
            f"skill_dir={str(skill_dir)!r} must be a folder inside the project; fix: a "
            f"relative path such as {str(SKILL_FOLDER)!r}"
        )
    skill = skill_dir / "SKILL.md"
    return [
        GuideFile(Path("AGENTS.md"), _template("AGENTS.md").format(skill=skill.as_posix())),
        GuideFile(skill, _template("SKILL.md")),
    ]


def write_guide(
    folder: str | Path = ".", *, skill_dir: Path = SKILL_FOLDER, force: bool = False
) -> list[Path]:
    """Write the guide into `folder` (a project); returns the paths written.

    An existing file is never replaced silently: without `force` nothing is written and
    `UsageError` names every file in the way."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{str(folder)!r} is a file; fix: name the project's folder")
    guide = guide_files(skill_dir)
    in_the_way = [folder / f.path for f in guide if (folder / f.path).exists()]
    if in_the_way and not force:
        names = ", ".join(str(p) for p in in_the_way)
        raise UsageError(
            f"{names} already exist{'s' if len(in_the_way) == 1 else ''}; rlcoach init "
            "does not overwrite files; fix: move them aside (to merge by hand), or pass "
            "--force to replace them"
        )
    written = []
    for f in guide:
        target = folder / f.path
        target.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(target, f.text)
        target.chmod(0o644)  # a project file others read (the temp file was private)
        written.append(target)
    return written
