"""`rlcoach serve` as a child process on 127.0.0.1: start, wait for health, kill -9, stop.

Used by `bench/serve_load.py` and by the serve tests (which add running an example
against it); it lives in bench/ because bench/ must not import tests/, and pytest finds
it through `pythonpath`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from rlcoach.runtime.processes import free_port


class ServeProcess:
    """`rlcoach serve` with a key, a root and a port; its log is kept beside the root."""

    def __init__(
        self,
        root: Path,
        engine: str,
        *extra: str,
        key: str | None = None,
        scheme: str = "http",
        env: dict[str, str] | None = None,
    ) -> None:
        """`scheme` https for a server started with --ssl-certfile; `env` is added to
        the server's environment."""
        self.root = root
        self.engine = engine
        self.extra = list(extra)
        self.key = key
        self.env = env or {}
        self.port = free_port()
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self.log = root.parent / f"serve-{self.port}.log"
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 300.0) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"), **self.env}
        env.pop("RLCOACH_API_KEY", None)
        if self.key:
            env["RLCOACH_API_KEY"] = self.key
        command = [
            sys.executable,
            "-m",
            "rlcoach.cli",
            "-v",
            "serve",
            "--engine",
            self.engine,
            "--port",
            str(self.port),
            "--root",
            str(self.root),
            *self.extra,
        ]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"serve exited: {self.log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"serve did not start: {self.log.read_text()[-3000:]}")

    def engine_pid(self) -> int:
        """The engine process's id, from the server's status route."""
        status = httpx.get(self.url + "/rlcoach/v1/status", headers=self.headers(), timeout=10)
        return int(status.json()["engine"]["pid"])

    def kill9(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}
