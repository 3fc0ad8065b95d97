"""`name@step`, written and read in one place (models/served_name.py)."""

import ast
from pathlib import Path

import pytest

from rlcoach.models.served_name import ServedName
from rlcoach.trajectory.trajectories import policy_version_of

CORE = Path(__file__).resolve().parents[2] / "core"


def test_a_served_name_round_trips():
    assert str(ServedName("calc-agent", 12)) == "calc-agent@12"
    assert ServedName.parse("calc-agent@12") == ServedName("calc-agent", 12)
    assert ServedName.split("calc-agent") == ("calc-agent", "")
    assert ServedName.split("calc-agent@7") == ("calc-agent", "7")
    assert policy_version_of("calc-agent@3") == 3


@pytest.mark.parametrize("text", ["calc", "calc@", "calc@x", "calc@²", "@3", "calc@1234567890", 7])
def test_anything_but_name_at_digits_is_no_served_name(text):
    assert ServedName.parse(text) is None
    assert policy_version_of(text) is None


def test_no_other_module_writes_name_at_step_itself():
    # An f-string `{...}@{...}` anywhere in the core is a second spelling of the name
    # (base_model's `repo@revision` is a hub reference, not a served name).
    spelled = []
    for path in CORE.rglob("*.py"):
        if path.name in {"served_name.py", "base_model.py"}:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.JoinedStr):
                parts = node.values
                for left, mid, right in zip(parts, parts[1:], parts[2:], strict=False):
                    if (
                        isinstance(left, ast.FormattedValue)
                        and isinstance(mid, ast.Constant)
                        and mid.value == "@"
                        and isinstance(right, ast.FormattedValue)
                    ):
                        spelled.append(f"{path.relative_to(CORE)}:{node.lineno}")
    assert spelled == []
