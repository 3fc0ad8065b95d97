"""W&B in offline mode: the run files on disk hold every step's metrics and the tables.

Nothing is faked: the real `wandb` SDK (its core service included) writes an offline run
under the run folder. wandb 0.31 has no Python reader for its `.wandb` transaction log,
so `_records` below reads it: a 7-byte header (`:W&B`, magic, version) then LevelDB-log
blocks of 32 KiB whose records (crc32, length, type) carry `wandb_internal_pb2.Record`s.
"""

import json
import struct

import wandb

from rlcoach import Trajectory, TrajectoryGroup, Verdict
from rlcoach.integrations.wandb import TABLE_COLUMNS, WandbSink
from rlcoach.observe.sinks import SinkSet, rollout_metrics, run_info

BLOCK = 32 * 1024


def _records(path):
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    offset, pending = 7, b""
    while offset + 7 <= len(data):
        room = BLOCK - (offset % BLOCK)
        if room < 7:  # a block's tail too short for a header is padding
            offset += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[offset : offset + 7])
        chunk = data[offset + 7 : offset + 7 + length]
        offset += 7 + length
        if kind == 0 and length == 0:
            continue
        pending += chunk
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _group(step):
    attempts = [
        Trajectory(
            reward=float(i == step),
            metrics={"success": float(i == step)},
            messages=[
                {"role": "user", "content": f"q{step}"},
                {"role": "assistant", "content": f"a{i}"},
            ],
            verdicts=[Verdict(judge="ruler", score=i / 10, explanation=f"reason {i}")],
        )
        for i in range(3)
    ]
    return TrajectoryGroup(attempts)


def test_offline_run_files_hold_the_metrics_and_tables(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sink = WandbSink(mode="offline", table_rows=2)
    sinks = SinkSet(
        run_info(tmp_path / "runs", "proj", "agent", "base", {"learning_rate": 0.001}), [sink]
    )
    for step in (1, 2, 3):
        groups = [_group(step)]
        sinks.log_trajectories(step, groups)
        sinks.log_metrics(
            step,
            {
                "event": "train",
                "loss": 1.0 / step,
                "kl": 0.01 * step,
                "trained": True,
                "mismatch_abs_mean": 0.02 * step,
                **rollout_metrics(groups),
            },
        )
    sinks.close()
    assert sinks.counters() == {"sink_errors/wandb": 0, "sink_dropped/wandb": 0}
    # `run.finish()` returns before wandb's service process has always written the offline
    # log (seen: the 7-byte header alone, about 1 run in 20); shutting the service down
    # flushes it, as the SDK's own exit hook does when a training process ends.
    wandb.teardown()

    (run_dir,) = (tmp_path / "runs" / "proj" / "agent" / "wandb").glob("offline-run-*")
    (log,) = run_dir.glob("run-*.wandb")
    history, config = [], {}
    for record in _records(log):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
        elif kind == "run":
            config.update(
                {item.key: json.loads(item.value_json) for item in record.run.config.update}
            )
    metrics = [h for h in history if "loss" in h]
    assert [h["training_step"] for h in metrics] == [1, 2, 3]
    assert [h["loss"] for h in metrics] == [1.0, 0.5, 1.0 / 3]
    assert [h["mismatch_abs_mean"] for h in metrics] == [0.02, 0.04, 0.06]
    assert metrics[0]["reward_mean"] == 1 / 3 and metrics[0]["rollout/success"] == 1 / 3
    assert metrics[0]["trained"] == 1.0 and "sink_errors/wandb" in metrics[0]
    tables = [h for h in history if "trajectories/path" in h]  # a table is a file + a pointer
    assert [h["training_step"] for h in tables] == [1, 2, 3]
    assert all(h["trajectories/_type"] == "table-file" for h in tables)
    assert config["train"] == {"learning_rate": 0.001} and config["base_model"] == "base"
    (table_file, *_) = sorted((run_dir / "files" / "media" / "table").glob("trajectories_*.json"))
    table = json.loads(table_file.read_text())
    assert table["columns"] == TABLE_COLUMNS and len(table["data"]) == 2
    row = dict(zip(TABLE_COLUMNS, table["data"][0], strict=True))
    assert row["training_step"] == 1 and row["task"] == "q1" and row["judge"].startswith("ruler 0.")
