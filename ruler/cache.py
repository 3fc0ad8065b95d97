"""The judge's answer cache: one JSON file per request, keyed by the full request.

The key hashes the endpoint URL and the complete request body (model, messages — so the
rubric, the ordering and any error fed back —, sampling options), so a cached answer is
only reused for exactly the same question. Re-running a step or an evaluation therefore
costs no judge calls. Files are written atomically; an unreadable file is a miss.

The cache is bounded: past `max_entries` files the least recently used (by modification
time; a hit touches its file) are removed down to 90% of the limit, and `put` returns how
many, which the judge counts in its usage (`ruler_cache_evicted` in the step's metrics).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from rlcoach.paths import write_text_atomic

__all__ = ["JudgeCache"]

logger = logging.getLogger(__name__)


class JudgeCache:
    """Judge responses on disk under `folder/<2 hex>/<sha256>.json`."""

    def __init__(self, folder: Path, max_entries: int = 100_000) -> None:
        self.folder = Path(folder)
        self.max_entries = max_entries
        self._count: int | None = None  # counted on the first put, then kept

    @staticmethod
    def key(url: str, request: dict[str, Any]) -> str:
        text = json.dumps({"url": url, "request": request}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        path = self._path(key)
        try:
            answer = json.loads(path.read_text(encoding="utf-8"))
            with contextlib.suppress(OSError):
                os.utime(path)  # recently used: evicted last
            return answer
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            logger.warning("ignoring an unreadable judge cache entry %s: %r", path, e)
            return None

    def put(self, key: str, response: dict[str, Any]) -> int:
        """Store an answer; return how many old entries were evicted to make room."""
        path = self._path(key)
        new = not path.exists()
        write_text_atomic(path, json.dumps(response))
        if self._count is None:
            self._count = sum(1 for _ in self.folder.glob("*/*.json"))
        elif new:
            self._count += 1
        return self._evict() if self._count > self.max_entries else 0

    def _evict(self) -> int:
        entries = []
        for file in self.folder.glob("*/*.json"):
            with contextlib.suppress(OSError):
                entries.append((file.stat().st_mtime, file))
        entries.sort()
        doomed = entries[: max(len(entries) - int(self.max_entries * 0.9), 0)]
        for _, file in doomed:
            file.unlink(missing_ok=True)
        self._count = len(entries) - len(doomed)
        logger.info("judge cache %s: evicted %d old entries", self.folder, len(doomed))
        return len(doomed)
