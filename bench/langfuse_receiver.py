"""A stand-in for a Langfuse server's ingestion endpoints, on 127.0.0.1.

Langfuse's server needs Docker (Postgres, ClickHouse, Redis, S3), which this machine does
not have, so the tests and `bench/sinks.py` point the real Langfuse SDK (5.2) at this
receiver instead. It accepts exactly what that SDK sends — spans as OTLP/HTTP protobuf
(gzip or not) on `/api/public/otel/v1/traces`, scores as a JSON list on
`/api/public/scores` — decodes the spans with `opentelemetry-proto`, and keeps
everything for the test or the benchmark to inspect. It lives in bench/ because both
use it (bench/ must not import tests/); pytest finds it through `pythonpath`.

    python bench/langfuse_receiver.py --port 3000   # stand-alone, prints what arrives
"""

from __future__ import annotations

import argparse
import gzip
import json
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

TRACES_PATH = "/api/public/otel/v1/traces"
SCORES_PATH = "/api/public/scores"


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind) if kind else None


@dataclass
class Span:
    """One decoded span, with the Langfuse attributes parsed from their JSON strings."""

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    scope: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)

    def attr(self, key: str) -> Any:
        """`langfuse.observation.<key>` (JSON-decoded where it is JSON)."""
        raw = self.attributes.get(f"langfuse.observation.{key}")
        if isinstance(raw, str):
            try:
                return json.loads(raw)
            except json.JSONDecodeError:
                return raw
        return raw

    @property
    def type(self) -> str | None:
        return self.attributes.get("langfuse.observation.type")


class LangfuseReceiver:
    """The HTTP server; `spans`, `scores` and `headers` fill as the SDK sends."""

    def __init__(self, port: int = 0) -> None:
        self.spans: list[Span] = []
        self.scores: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.unknown: list[str] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                with receiver._lock:
                    receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
                if self.path == TRACES_PATH:
                    receiver._spans(body)
                    reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                    self._send(200, reply, "application/x-protobuf")
                elif self.path == SCORES_PATH:
                    with receiver._lock:
                        receiver.scores.extend(json.loads(body))
                    self._send(202, b'{"message": "Accepted"}', "application/json")
                else:
                    receiver.unknown.append(self.path)
                    self._send(404, b'{"message": "not here"}', "application/json")

            def do_GET(self) -> None:
                receiver.unknown.append(self.path)
                self._send(404, b'{"message": "not here"}', "application/json")

            def _send(self, status: int, payload: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def _spans(self, body: bytes) -> None:
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(body)
        decoded = []
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                for span in scope.spans:
                    decoded.append(
                        Span(
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex() or None,
                            name=span.name,
                            scope=scope.scope.name,
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            attributes={kv.key: _value(kv.value) for kv in span.attributes},
                        )
                    )
        with self._lock:
            self.spans.extend(decoded)

    def traces(self) -> dict[str, list[Span]]:
        """Spans by trace id."""
        out: dict[str, list[Span]] = defaultdict(list)
        with self._lock:
            for span in self.spans:
                out[span.trace_id].append(span)
        return dict(out)

    def scores_of(self, trace_id: str) -> dict[str, dict[str, Any]]:
        """Scores of a trace, by name."""
        with self._lock:
            return {s["name"]: s for s in self.scores if s.get("traceId") == trace_id}

    def wait(self, condition: Any, timeout_s: float = 30.0) -> bool:
        """Poll `condition()` until it is true or the time is up."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(0.05)
        return bool(condition())

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=3000)
    args = parser.parse_args()
    receiver = LangfuseReceiver(args.port)
    print(f"listening on {receiver.url}", flush=True)
    seen = (0, 0)
    while True:
        time.sleep(1)
        now = (len(receiver.spans), len(receiver.scores))
        if now != seen:
            print(f"{now[0]} spans in {len(receiver.traces())} traces, {now[1]} scores", flush=True)
            seen = now
