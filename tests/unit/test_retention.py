"""The retention policy (retention.py) on a run folder laid out on disk."""

import json
import os

from rlcoach.backend.retention import OPTIMIZER_FILE, RetentionConfig, apply_retention
from rlcoach.paths import RunPaths


def run_folder(tmp_path, steps=6, rewards=None):
    paths = RunPaths(tmp_path, "p", "m")
    for step in range(1, steps + 1):
        folder = paths.checkpoint(step)
        folder.mkdir(parents=True)
        (folder / "adapter_config.json").write_text("{}")
        (folder / OPTIMIZER_FILE).write_bytes(b"x")
    rewards = rewards or {}
    lines = [{"step": s, "event": "train", "reward_mean": rewards.get(s, 0.0)} for s in rewards]
    paths.metrics.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"torn')
    return paths


def kept(paths):
    return [int(p.name) for p in sorted(paths.checkpoints.iterdir())]


def test_the_defaults_keep_every_checkpoint_and_only_the_latest_optimizer_state(tmp_path):
    paths = run_folder(tmp_path)
    pruned = apply_retention(paths, RetentionConfig(), latest_step=6)
    assert kept(paths) == [1, 2, 3, 4, 5, 6] and pruned.checkpoints == []
    with_state = [s for s in kept(paths) if (paths.checkpoint(s) / OPTIMIZER_FILE).exists()]
    assert with_state == [6] and pruned.optimizer_states == 5


def test_keep_last_best_and_pinned(tmp_path):
    paths = run_folder(tmp_path, rewards={1: 0.1, 2: 0.9, 3: 0.2, 4: 0.3, 5: 0.4, 6: 0.5})
    config = RetentionConfig(keep_last=2, keep_best=1, pinned=[1])
    pruned = apply_retention(paths, config, latest_step=6)
    assert kept(paths) == [1, 2, 5, 6]  # pinned 1, best 2 (0.9), the last two
    assert sorted(pruned.checkpoints) == [3, 4]
    # Removed through a .tmp- name that a restart cleans up: nothing half-deleted is left.
    assert not [p for p in paths.checkpoints.iterdir() if p.name.startswith(".")]


def test_the_latest_step_is_never_removed_even_when_older_ones_are_newer_on_disk(tmp_path):
    paths = run_folder(tmp_path, steps=3)
    apply_retention(paths, RetentionConfig(keep_last=1), latest_step=2)
    assert kept(paths) == [2, 3]  # 3 is newer than the served step 2: not pruned either


def test_request_files_and_logs_keep_the_newest(tmp_path):
    paths = run_folder(tmp_path, steps=1)
    requests = paths.dir / "requests"
    requests.mkdir()
    for index in range(5):
        for suffix in (".jsonl", ".result.json"):
            file = requests / f"req{index}{suffix}"
            file.write_text("x")
            os.utime(file, (1000 + index, 1000 + index))
    logs = tmp_path / "logs"
    logs.mkdir()
    for index in range(4):
        log = logs / f"engine-{index}.log"
        log.write_text("x")
        os.utime(log, (1000 + index, 1000 + index))
    config = RetentionConfig(requests_keep_last=2, logs_keep_last=1)
    pruned = apply_retention(paths, config, latest_step=1, logs=logs)
    assert sorted(p.name for p in requests.iterdir()) == [
        "req3.jsonl",
        "req3.result.json",
        "req4.jsonl",
        "req4.result.json",
    ]
    assert [p.name for p in logs.iterdir()] == ["engine-3.log"]
    assert (pruned.request_files, pruned.logs) == (6, 3)
