"""The HTTP client and the result types it returns never import torch.

A fresh interpreter (a test process has torch loaded already) imports `rlcoach`,
`rlcoach.serve.remote` and the trainer's torch-free types (trainer/base.py), rebuilds an RL and
an SFT step result from their wire form as `RemoteBackend.train` does, and reports
whether `torch` is in `sys.modules`. (`import rlcoach` alone: test_packaging.py.)"""

import json
import subprocess
import sys

SCRIPT = """
import json, sys
import rlcoach
from rlcoach.serve.remote import _step_result
from rlcoach.trainer.base import SFTStats, StepStats, Trainer
from rlcoach.serve.wire import StepResultWire

rl = {
    "trained": True, "groups": 2, "groups_skipped_no_variance": 0, "trajectories": 8,
    "sequences": 8, "sampled_tokens": 100, "total_tokens": 400, "loss": 0.5,
    "grad_norm": 1.0, "clip_fraction": 0.1, "kl": 0.0, "mean_ratio": 1.0, "seconds": 2.0,
    "non_finite": 0, "optimizer_steps": 1,
    "mismatch_abs_mean": 0.01, "mismatch_abs_max": 0.2, "mismatch_kl_k3": 1e-4,
    "mismatch_beyond_fraction": 0.0,
}
sft = {
    "trained": True, "examples": 4, "sequences": 4, "optimizer_steps": 1,
    "trained_tokens": 50, "total_tokens": 200, "loss_first": 2.0, "loss_last": 1.5,
    "loss": 1.7, "grad_norm": 3.0, "seconds": 1.0, "non_finite": 0,
}
results = [
    _step_result(StepResultWire(step=3, stats=rl, checkpoint="p/m/checkpoints/3")),
    _step_result(StepResultWire(step=4, kind="sft", stats=sft)),
]
print(json.dumps({
    "kinds": [type(r.stats).__name__ for r in results],
    "round_trip": [results[0].stats.as_dict() == rl, results[1].stats.as_dict() == sft],
    "torch": "torch" in sys.modules,
}))
"""


def test_the_client_and_its_result_types_do_not_import_torch():
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, timeout=120
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report == {
        "kinds": ["StepStats", "SFTStats"],
        "round_trip": [True, True],
        "torch": False,
    }
