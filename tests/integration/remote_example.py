"""Run an example script, unchanged, against `rlcoach serve` instead of a LocalBackend.

    RLCOACH_URL=http://127.0.0.1:8000 RLCOACH_API_KEY=... \\
        python tests/integration/remote_example.py examples/basic_loop.py --steps 1

The examples build `LocalBackend(root, engine=...)`; this runner puts a factory of
`RemoteBackend(url, key, root=root)` in its place before the script runs, which is the
one line a user would change. The engine argument is the server's business and ignored.
"""

import os
import runpy
import sys

import rlcoach
from rlcoach import RemoteBackend


def remote_backend(root=".rlcoach", engine=None):
    return RemoteBackend(os.environ["RLCOACH_URL"], os.environ.get("RLCOACH_API_KEY"), root=root)


if __name__ == "__main__":
    rlcoach.LocalBackend = remote_backend
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
