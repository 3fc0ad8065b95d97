"""Reading a JSON answer out of a helper model's reply (a judge, a task generator).

Models asked for "only a JSON object" still wrap it in code fences or a sentence;
`json_object` takes the outermost `{...}` of the reply (inside a fence if there is
one) and raises `ValueError` with a message written to be fed back to the model.
"""

from __future__ import annotations

import json
import re
from typing import Any

from rlcoach.errors import AnswerError

__all__ = ["json_object"]


def json_object(content: str) -> Any:
    """The JSON object in `content`, or `AnswerError` (a `ValueError`) saying why there
    is none; the message is written to be fed back to the model that answered."""
    text = content.strip()
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    if fenced:
        text = fenced.group(1).strip()
    start, end = text.find("{"), text.rfind("}")
    if start == -1 or end < start:
        raise AnswerError(
            f"the answer contains no JSON object (it began {content[:80]!r}); fix: answer "
            "with one JSON object, {...}"
        )
    try:
        return json.loads(text[start : end + 1])
    except json.JSONDecodeError as e:
        raise AnswerError(
            f"the answer is not valid JSON ({e.msg} at character {e.pos}); fix: answer with "
            "one valid JSON object (double-quoted keys, no trailing commas)"
        ) from e
