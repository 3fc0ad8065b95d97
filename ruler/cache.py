"""The judge's answer cache: one JSON file per request, keyed by the full request.

The key hashes the endpoint URL and the complete request body (model, messages — so the
rubric, the ordering and any error fed back —, sampling options), so a cached answer is
only reused for exactly the same question. Re-running a step or an evaluation therefore
costs no judge calls. Files are written atomically; an unreadable file is a miss.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from rlcoach.paths import write_text_atomic

__all__ = ["JudgeCache"]

logger = logging.getLogger(__name__)


class JudgeCache:
    """Judge responses on disk under `folder/<2 hex>/<sha256>.json`."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    @staticmethod
    def key(url: str, request: dict[str, Any]) -> str:
        text = json.dumps({"url": url, "request": request}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        path = self._path(key)
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            logger.warning("ignoring an unreadable judge cache entry %s: %r", path, e)
            return None

    def put(self, key: str, response: dict[str, Any]) -> None:
        write_text_atomic(self._path(key), json.dumps(response))
