"""A real `rlcoach serve` subprocess for the serve tests (start, kill -9, restart), with a
key, and a way to run an example against it (`bench/served.py` holds the process part)."""

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from served import ServeProcess as _Served

KEY = "test-key-5b0c1f"
RUNNER = Path(__file__).with_name("remote_example.py")


class ServeProcess(_Served):
    """`rlcoach serve` with the test key unless told otherwise."""

    def __init__(
        self, root: Path, engine: str, *extra: str, key: str | None = KEY, **options: Any
    ) -> None:
        super().__init__(root, engine, *extra, key=key, **options)

    def run_example(
        self, script: Path, args: list[str], client_root: Path, timeout_s: float = 600
    ) -> subprocess.CompletedProcess:
        """Run an example unchanged, its LocalBackend swapped for a RemoteBackend to us."""
        env = {**os.environ, "RLCOACH_URL": self.url, "RLCOACH_API_KEY": self.key or ""}
        return subprocess.run(
            [sys.executable, str(RUNNER), str(script), *args, "--root", str(client_root)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
        )
