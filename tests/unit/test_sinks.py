"""Sinks: the disk record is written inline; plug-ins never block or fail a step, and
what goes wrong with them is counted in the metrics."""

import json
import threading

import pytest

from rlcoach import ConfigError, RolloutFailure, Trajectory, TrajectoryGroup, load_groups
from rlcoach.observe.sinks import (
    SinkConfig,
    SinkSet,
    open_sinks,
    resolve_sinks,
    rollout_metrics,
    run_info,
)


class Recording:
    """A plug-in sink that keeps what it got; `gate` holds it back, `fail` makes it raise."""

    def __init__(self, name="rec", fail_on=(), gate=None):
        self.name = name
        self.fail_on = set(fail_on)
        self.gate = gate
        self.calls = []
        self.closed = False

    def start(self, run):
        if "start" in self.fail_on:
            raise RuntimeError("service down")
        self.run = run

    def log_trajectories(self, step, groups):
        if self.gate is not None:
            self.gate.wait()
        if "log_trajectories" in self.fail_on:
            raise RuntimeError("rejected")
        self.calls.append(("trajectories", step, groups))

    def log_metrics(self, step, metrics):
        if "log_metrics" in self.fail_on:
            raise RuntimeError("rejected")
        self.calls.append(("metrics", step, metrics))

    def close(self):
        self.closed = True


def _groups():
    a = Trajectory(reward=1.0, metrics={"success": 1.0}, metadata={"q": "x"})
    b = Trajectory(reward=0.0, metrics={"success": 0.0, "turns": 2.0})
    return [TrajectoryGroup([a, b], metadata={"ruler_calls": 2, "ruler_failed": False})]


def _run(tmp_path):
    return run_info(tmp_path, "proj", "agent", "base", {"learning_rate": 0.1})


def test_disk_record_and_plugins_get_the_same_step(tmp_path):
    plugin = Recording()
    sinks = SinkSet(_run(tmp_path), [plugin])
    groups = _groups()
    sinks.log_trajectories(1, groups)
    groups[0].trajectories[0].reward = 42.0  # the caller changes its groups afterwards
    record = sinks.log_metrics(1, {"event": "train", "loss": 0.5})
    sinks.close()
    assert plugin.closed and plugin.run.project == "proj"
    (kind, step, sent), (_, _, metrics) = plugin.calls
    assert (kind, step) == ("trajectories", 1)
    assert sent[0].trajectories[0].reward == 1.0  # the sink got its own copy
    assert metrics == record and metrics["loss"] == 0.5
    assert record["sink_errors/rec"] == 0 and record["sink_dropped/rec"] == 0
    files = tmp_path / "proj" / "agent"
    assert load_groups(files / "trajectories" / "000001.jsonl")[0].rewards == [1.0, 0.0]
    line = json.loads((files / "metrics.jsonl").read_text())
    assert line["event"] == "train" and line["step"] == 1 and line["sink_errors/rec"] == 0


def test_a_failing_plugin_is_counted_and_the_step_goes_on(tmp_path):
    plugin = Recording(fail_on={"log_trajectories"})
    sinks = SinkSet(_run(tmp_path), [plugin])
    sinks.log_trajectories(1, _groups())
    sinks.log_trajectories(2, _groups())
    sinks.close()  # drains: both calls have run and failed
    assert plugin.calls == [] and plugin.closed
    assert sinks.counters()["sink_errors/rec"] == 2


def test_a_plugin_that_cannot_start_drops_its_events(tmp_path):
    plugin = Recording(fail_on={"start"})
    sinks = SinkSet(_run(tmp_path), [plugin])
    sinks.log_trajectories(1, _groups())
    sinks.close()
    counts = sinks.counters()
    assert counts["sink_errors/rec"] == 1 and counts["sink_dropped/rec"] == 1
    assert not plugin.closed  # never started, so never closed


def test_a_stuck_plugin_never_blocks_a_step(tmp_path):
    gate = threading.Event()
    plugin = Recording(gate=gate)
    sinks = SinkSet(_run(tmp_path), [plugin], SinkConfig(queue_size=2, close_timeout_s=5))
    for step in range(1, 11):  # returns at once although the sink is stuck on step 1
        sinks.log_trajectories(step, _groups())
    record = sinks.log_metrics(10, {"event": "train"})
    # Step 1 is in the sink's hands, 2 and 3 wait in the queue, 4..10 and the record drop.
    assert record["sink_dropped/rec"] == 7
    gate.set()
    sinks.close()
    assert [c[1] for c in plugin.calls] == [1, 2, 3]
    assert sinks.counters()["sink_dropped/rec"] == 8


def test_sinks_config_forms(tmp_path):
    config, objects = resolve_sinks(["wandb", Recording()])
    assert config.plugins == {"wandb": True} and len(objects) == 1
    config, objects = resolve_sinks({"plugins": {"wandb": {"mode": "offline"}}})
    assert config.plugins["wandb"] == {"mode": "offline"} and objects == []
    with pytest.raises(ConfigError, match="neither a plug-in name nor a Sink"):
        resolve_sinks([3])
    with pytest.raises(ConfigError, match="queue_size"):
        resolve_sinks({"queue_size": 0})
    with pytest.raises(ConfigError, match="'nope' is not installed"):
        open_sinks(_run(tmp_path), SinkConfig(plugins={"nope": True}))


def test_rollout_metrics():
    groups = _groups()
    groups[0].failures.append(RolloutFailure(type="E", message="m"))
    metrics = rollout_metrics(groups)
    assert metrics["reward_mean"] == 0.5 and metrics["reward_std"] == 0.5
    assert metrics["rollouts"] == 2 and metrics["rollout_failures"] == 1
    assert metrics["rollout/success"] == 0.5 and metrics["rollout/turns"] == 2.0
    assert metrics["group/ruler_calls"] == 2 and "group/ruler_failed" not in metrics
    assert rollout_metrics([])["rollouts"] == 0
