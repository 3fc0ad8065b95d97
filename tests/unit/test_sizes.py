"""One concept per module, and functions a reader can follow: the sizes CONTRIBUTING asks
for, read from the source of the library (core, ruler, autorl, integrations).

A module over 600 lines holds more than one concept; a function whose body (its
statements after the docstring) runs past 80 lines does more than one thing.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ["core", "ruler", "autorl", "integrations"]
MAX_MODULE_LINES = 600
MAX_BODY_LINES = 80


def _sources() -> list[Path]:
    return sorted(p for folder in LIBRARY for p in (ROOT / folder).rglob("*.py"))


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = node.body
    if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    return node.end_lineno - body[0].lineno + 1


def test_no_module_is_over_600_lines():
    big = [
        f"{p.relative_to(ROOT)}: {n}"
        for p in _sources()
        if (n := p.read_text().count("\n")) > MAX_MODULE_LINES
    ]
    assert big == []


def test_no_function_body_is_over_80_lines():
    long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            if function and (n := _body_lines(node)) > MAX_BODY_LINES:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n})")
    assert long == []


def test_the_size_check_counts_the_body_without_the_docstring():
    source = 'def f():\n    """Doc\n    string."""\n    a = 1\n    return a\n'
    (node,) = ast.parse(source).body
    assert _body_lines(node) == 2
