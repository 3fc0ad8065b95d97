"""JSON for the policy endpoint's hot path: orjson where it is installed, else the stdlib.

Every completion the gateway forwards is parsed once (to route, record and rename it)
and written once; a 512-token answer with logprobs is ~52 KB of JSON, which the standard
library takes ~1 ms to parse and ~1.8 ms to write on this CPU, and orjson ~0.4 and
~0.16 ms (bench/gateway_overhead.py). Same values either way, except that orjson writes
NaN and infinities as `null` (the standard library writes `NaN`, which is not JSON).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["dumps", "loads"]

try:
    import orjson

    def loads(data: bytes | str) -> Any:
        """Parse JSON (raises `ValueError` on bad input, as `json.loads` does)."""
        return orjson.loads(data)

    def dumps(value: Any) -> bytes:
        """Serialise to compact UTF-8 JSON."""
        return orjson.dumps(value)

except ImportError:  # pragma: no cover - orjson is a dependency; this keeps a bare env working

    def loads(data: bytes | str) -> Any:
        return json.loads(data)

    def dumps(value: Any) -> bytes:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
