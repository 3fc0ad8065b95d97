"""The documentation points at things that exist, and the README stays a short guide.

README.md, CONTRIBUTING.md and every page under docs/ are read as Markdown text (no
renderer): each relative link must resolve to a file inside the repository and its
`#anchor` to a heading of that file (GitHub's slugs); each repository path written in
backticks or in a code block (`core/...`, `tests/...`, `bench/...`, `examples/...`, ...)
must exist, read from the repository root, where every command in the docs runs; no link
or command may reach outside the repository (`../`); the `rlcoach` package's files are
named by their folder (`core/...`), not by the import name; every `make` target named
exists; every page under docs/ is listed in docs/README.md; README.md is at most 12 KB.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_LIMIT_BYTES = 12 * 1024
# Top-level folders whose paths the docs name; a path written from one of them is checked.
PATH_ROOTS = ("core", "ruler", "autorl", "integrations", "examples", "bench", "tests", "docs")
REPO_PATH = re.compile(rf"(?<![\w./~$<-])((?:{'|'.join(PATH_ROOTS)})/[\w./*-]*)")
PACKAGE_PATH = re.compile(r"(?<![\w./-])rlcoach/[\w/]+\.py")
OUTSIDE = re.compile(r"(?<![\w.])\.\./")
MAKE_TARGET = re.compile(r"\bmake ([a-z][\w-]*)")
FENCE = re.compile(r"^ {0,3}(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def doc_files(root: Path = ROOT) -> list[Path]:
    pages = sorted((root / "docs").rglob("*.md")) if (root / "docs").is_dir() else []
    return [p for p in (root / "README.md", root / "CONTRIBUTING.md") if p.is_file()] + pages


def split_markdown(text: str) -> tuple[str, list[str]]:
    """(the prose with fenced blocks blanked out, the fenced blocks' contents)."""
    prose, blocks, block, fence = [], [], [], None
    for line in text.splitlines():
        opener = FENCE.match(line)
        if fence is None and opener:
            fence, block = opener.group(1), []
            prose.append("")
        elif fence is not None and line.strip().startswith(fence):
            fence = None
            blocks.append("\n".join(block))
            prose.append("")
        elif fence is not None:
            block.append(line)
            prose.append("")
        else:
            prose.append(line)
    return "\n".join(prose), blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    prose, _ = split_markdown(path.read_text())
    seen: dict[str, int] = {}
    found = set()
    for line in prose.splitlines():
        heading = HEADING.match(line)
        if heading is None:
            continue
        base = slug(heading.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def link_targets(text: str) -> list[str]:
    prose, _ = split_markdown(text)
    prose = INLINE_CODE.sub(lambda m: " " * len(m.group(0)), prose)
    return LINK.findall(prose) + REFERENCE.findall(prose)


def code_texts(text: str) -> list[str]:
    """Every piece of code in the page: inline spans and fenced blocks."""
    prose, blocks = split_markdown(text)
    return [m.group(2) for m in INLINE_CODE.finditer(prose)] + blocks


def make_targets(root: Path) -> set[str]:
    makefile = root / "Makefile"
    text = makefile.read_text() if makefile.is_file() else ""
    return {t for line in re.findall(r"^([\w .-]+):", text, re.M) for t in line.split()}


def problems(doc: Path, root: Path = ROOT) -> list[str]:
    """Everything wrong with one page's links and paths, as messages naming the fix."""
    text = doc.read_text()
    name = doc.relative_to(root)
    found = []
    for target in link_targets(text):
        if SCHEME.match(target):
            continue  # a URL: not checked offline
        path_part, _, anchor = target.partition("#")
        resolved = (doc.parent / path_part).resolve() if path_part else doc.resolve()
        if not resolved.is_relative_to(root.resolve()):
            found.append(f"{name}: link {target!r} leaves the repository; fix: link inside it")
            continue
        if not resolved.exists():
            found.append(f"{name}: link {target!r} points at nothing; fix the path")
            continue
        if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            found.append(
                f"{name}: link {target!r} names no heading of {resolved.name}; fix: use one of "
                f"{sorted(anchors(resolved))}"
            )
    targets = make_targets(root)
    for code in code_texts(text):
        for path in REPO_PATH.findall(code):
            path = path.rstrip(".,:;")
            if not any(root.glob(path.rstrip("/"))):
                found.append(f"{name}: `{path}` does not exist; fix the path or the text")
        for path in PACKAGE_PATH.findall(code):
            found.append(
                f"{name}: `{path}` names the import package, not a file; fix: the package "
                "`rlcoach` is the folder core/ (rlcoach.ruler is ruler/, ...)"
            )
        if OUTSIDE.search(code):
            found.append(
                f"{name}: {code.strip()[:80]!r} reaches outside the repository with '../'; "
                "fix: write commands and paths from the repository root"
            )
        for target in MAKE_TARGET.findall(code):
            if target not in targets:
                found.append(f"{name}: `make {target}` is no Makefile target; fix the name")
    return found


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_and_paths_resolve(doc):
    assert problems(doc) == []


def test_every_docs_page_is_listed_in_the_index():
    index = ROOT / "docs" / "README.md"
    targets = link_targets(index.read_text())
    listed = {(index.parent / t.partition("#")[0]).resolve() for t in targets}
    pages = {p.resolve() for p in (ROOT / "docs").rglob("*.md") if p != index}
    missing = sorted(str(p.relative_to(ROOT)) for p in pages - listed)
    assert not missing, f"pages missing from docs/README.md: {missing}; fix: add a row for each"


def test_readme_is_a_short_guide():
    size = (ROOT / "README.md").stat().st_size
    assert size <= README_LIMIT_BYTES, (
        f"README.md is {size} bytes, over {README_LIMIT_BYTES}; fix: move detail to a page "
        "under docs/ and link it"
    )


def test_the_checks_catch_what_they_are_for(tmp_path):
    """The checker itself, on a small repository written here: each kind of mistake is
    reported, and correct links, anchors, paths and targets are not."""
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "model.py").write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n\n## Known limits: `x`\n")
    (tmp_path / "Makefile").write_text("test test-fast: x\n\tpytest\n")
    readme = tmp_path / "README.md"
    readme.write_text(
        "[ok](docs/guide.md#known-limits-x) [ok](#two) [web](https://example.org/x)\n"
        "[broken](docs/missing.md) [anchor](docs/guide.md#nowhere) [out](../x.md)\n"
        "`core/model.py` `core/nothing.py` `rlcoach/trainer/lora.py` `make test-fast`\n\n"
        "## Two\n\n```bash\nbash ../shared/run.sh\n```\n\n"
        "```bash\nmake nothing\npython examples/absent.py\n```\n"
    )
    found = problems(readme, tmp_path)
    assert len(found) == 8, found
    for mistake in (
        "docs/missing.md",
        "#nowhere",
        "../x.md",
        "core/nothing.py",
        "rlcoach/trainer/lora.py",
        "make nothing",
        "examples/absent.py",
        "../shared/run.sh",
    ):
        assert sum(mistake in f for f in found) == 1, (mistake, found)
