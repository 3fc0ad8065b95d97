"""Recorded exchanges: what the policy endpoint answered, kept per rollout id.

The gateway (gateway.py) keeps every chat completion that carries a rollout id here, in
arrival order; the rollout scope takes them when it closes (rollout.py), and they become
the trajectory's histories (recording.py). While a rollout runs, the gateway also reads
back the tool-calling replies it recorded for it (`Recorder.replies`), to send them to
the engine as the text that was sampled.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from typing import Any, NamedTuple

from rlcoach.engines import fastjson
from rlcoach.trajectory.exchange import Exchange
from rlcoach.trajectory.histories import message_key

__all__ = ["Exchange", "Recorder"]


class Recorder:
    """Exchanges (request, response) per rollout id, in arrival order. Thread-safe.

    A response may be kept as the engine's raw JSON (`add_raw`), parsed only when the
    rollout takes its exchanges (with the garbage collector paused, `fastjson.gc_paused`):
    parsing a 512-token answer with logprobs makes thousands of Python objects, and doing
    it on the way out made the answer wait for it and the collector walk every parsed
    answer still held (most of the endpoint's time, bench/gateway_overhead.py).

    Bounded: a rollout nobody takes (cancelled, timed out, its late replies still
    arriving) would otherwise be kept forever. A rollout untouched for `ttl_s` expires,
    the least recently touched one goes when `max_rollouts` are held, and a rollout keeps
    at most `max_exchanges` calls; everything dropped is counted (`counters()`, served in
    `rlcoach serve`'s /metrics).
    """

    def __init__(
        self, max_rollouts: int = 10_000, max_exchanges: int = 4096, ttl_s: float = 3600.0
    ) -> None:
        self.max_rollouts = max_rollouts
        self.max_exchanges = max_exchanges
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        # Ordered by last touch, so the expired and the least recent are at the front.
        self._exchanges: OrderedDict[str, tuple[float, list[_Kept]]] = OrderedDict()
        self._dropped: Counter[str] = Counter()

    def add(self, rollout_id: str, request: dict[str, Any], response: dict[str, Any]) -> None:
        self._keep(rollout_id, request, response)

    def add_raw(
        self, rollout_id: str, request: dict[str, Any], raw: bytes, extra: dict[str, Any]
    ) -> None:
        """Keep a response as its JSON bytes, with `extra` keys added when parsed."""
        self._keep(rollout_id, request, (raw, extra))

    def _keep(self, rollout_id: str, request: dict[str, Any], response: Any) -> None:
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            _, exchanges = self._exchanges.pop(rollout_id, (now, []))
            while len(self._exchanges) >= self.max_rollouts:
                _, (_, evicted) = self._exchanges.popitem(last=False)
                self._dropped["rollouts_evicted"] += 1
                self._dropped["exchanges"] += len(evicted)
            if len(exchanges) >= self.max_exchanges:
                self._dropped["exchanges_over_limit"] += 1
            else:
                exchanges.append(_Kept(request, response))
            self._exchanges[rollout_id] = (now, exchanges)

    def take(self, rollout_id: str) -> list[Exchange]:
        with self._lock:
            self._expire(time.monotonic())
            kept = self._exchanges.pop(rollout_id, (0.0, []))[1]
        with fastjson.gc_paused():
            return [Exchange.recorded(request, _parsed(response)) for request, response in kept]

    def _expire(self, now: float) -> None:
        while self._exchanges:
            touched, exchanges = next(iter(self._exchanges.values()))
            if now - touched < self.ttl_s:
                return
            self._exchanges.popitem(last=False)
            self._dropped["rollouts_expired"] += 1
            self._dropped["exchanges"] += len(exchanges)

    def counters(self) -> dict[str, int]:
        """Rollouts held now and what was dropped so far (for /metrics)."""
        with self._lock:
            self._expire(time.monotonic())
            return {
                "recorder_rollouts": len(self._exchanges),
                "recorder_rollouts_expired": self._dropped["rollouts_expired"],
                "recorder_rollouts_evicted": self._dropped["rollouts_evicted"],
                "recorder_exchanges_dropped": self._dropped["exchanges"]
                + self._dropped["exchanges_over_limit"],
            }

    def replies(self, rollout_id: str) -> dict[str, dict[str, Any]]:
        """The recorded choices of a rollout that called tools, by their message's key."""
        with self._lock:
            exchanges = self._exchanges.get(rollout_id, (0.0, []))[1]
            for index, (request, response) in enumerate(exchanges):
                if isinstance(response, tuple):  # parsed once, kept parsed (and annotated)
                    exchanges[index] = _Kept(request, _parsed(response))
            exchanges = list(exchanges)
        found = {}
        for _, response in exchanges:
            for choice in response.get("choices") or []:
                message = choice.get("message") or {}
                if message.get("tool_calls"):
                    found[message_key({"role": "assistant", **message})] = choice
        return found


class _Kept(NamedTuple):
    """A call as kept until its rollout takes it: the response is a dict, or (raw JSON,
    keys to add) from `add_raw`, parsed when taken."""

    request: dict[str, Any]
    response: Any


def _parsed(response: Any) -> dict[str, Any]:
    if isinstance(response, tuple):
        raw, extra = response
        return {**fastjson.loads(raw), **extra}
    return response
