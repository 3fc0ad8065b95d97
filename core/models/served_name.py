"""Served names: a trained model at one step is served as `name@step`.

Every trainable model is served under `name@step` for each checkpointed step (step 0 is
the base weights) and under plain `name`, its latest step. The name is how a recorded
choice says which policy version sampled it, how the router finds an adapter, and how a
checkpoint is withdrawn; this module is the one place that writes and reads it. Model
names never hold an `@` (`config.check_name`), so the text after the last `@` is the
step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["ServedName"]

_STEP = re.compile(r"[0-9]{1,9}")  # ASCII digits only: "²".isdigit() is True


@dataclass(frozen=True, slots=True)
class ServedName:
    """`model@step`: a trainable model's weights after `step` training steps."""

    model: str
    step: int

    def __str__(self) -> str:
        return f"{self.model}@{self.step}"

    @staticmethod
    def split(text: str) -> tuple[str, str]:
        """(model, step text) of a requested name; the step text is "" for plain `model`."""
        model, _, step = text.rpartition("@")
        return (model, step) if model else (text, "")

    @classmethod
    def parse(cls, text: object) -> ServedName | None:
        """The served name `text` spells, or None for anything but `model@<digits>`."""
        if not isinstance(text, str):
            return None
        model, step = cls.split(text)
        return cls(model, int(step)) if step and _STEP.fullmatch(step) else None
