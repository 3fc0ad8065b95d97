"""What sinks cost a training step: the inline part against the part on the sink thread.

    .venv/bin/python bench/sinks.py --rollouts 64

Builds a step of agent-like trajectories (three policy calls and two tool calls each),
then times `SinkSet.log_trajectories` + `log_metrics` — what the step waits for — with
only the disk record, and with the Langfuse sink (the real SDK) exporting to the local
receiver the tests use, and measures how long the Langfuse export itself takes (until the
receiver holds every span and score). Prints the ratios.
"""

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from langfuse_receiver import LangfuseReceiver

from rlcoach import SampledChoice, Trajectory, TrajectoryGroup
from rlcoach.integrations.langfuse import LangfuseSink
from rlcoach.observe.sinks import SinkSet, rollout_metrics, run_info


def _trajectory(index: int) -> Trajectory:
    messages = [
        {"role": "system", "content": "You are an inventory agent. " * 20},
        {"role": "user", "content": f"Is widget {index} in stock?"},
    ]
    choices = []
    for turn in range(3):
        call = {
            "id": f"c{turn}",
            "type": "function",
            "function": {"name": "lookup", "arguments": f'{{"sku": "W{index}-{turn}"}}'},
        }
        reply = (
            {"role": "assistant", "content": None, "tool_calls": [call]}
            if turn < 2
            else {"role": "assistant", "content": "Yes, 12 in stock."}
        )
        choices.append(
            SampledChoice(
                message=reply,
                prompt_token_ids=list(range(300 + 60 * turn)),
                token_ids=list(range(40)),
                logprobs=[-0.4] * 40,
                policy="agent@3",
                started_at=1000.0 + turn,
                latency_s=0.5,
            )
        )
        messages.append(reply)
        if turn < 2:
            answer = {"role": "tool", "tool_call_id": f"c{turn}", "content": "qty: 12 " * 30}
            messages.append(answer)
    return Trajectory(
        messages=messages,
        choices=choices,
        reward=index % 3 / 2,
        metrics={"success": float(index % 3 == 2)},
        metadata={"sku": f"W{index}"},
        started_at=999.0,
        finished_at=1004.0,
    )


def _step(sinks: SinkSet, groups: list[TrajectoryGroup], step: int) -> float:
    started = time.perf_counter()
    sinks.log_trajectories(step, groups)
    sinks.log_metrics(step, {"event": "train", "loss": 0.1, **rollout_metrics(groups)})
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    groups = [
        TrajectoryGroup([_trajectory(g * 8 + i) for i in range(8)])
        for g in range(max(args.rollouts // 8, 1))
    ]
    rollouts = sum(len(g.trajectories) for g in groups)
    receiver = LangfuseReceiver()
    disk, with_langfuse, export = [], [], []
    with tempfile.TemporaryDirectory() as root:
        for repeat in range(args.repeats):
            info = run_info(Path(root) / f"d{repeat}", "bench", "agent", "base", {})
            sinks = SinkSet(info)
            disk.append(_step(sinks, groups, 1))
            sinks.close()
            sink = LangfuseSink(
                public_key=f"pk-{uuid.uuid4().hex[:8]}", secret_key="sk", host=receiver.url
            )
            sinks = SinkSet(
                run_info(Path(root) / f"l{repeat}", "bench", "agent", "base", {}), [sink]
            )
            before = len(receiver.scores)
            started = time.perf_counter()
            with_langfuse.append(_step(sinks, groups, 1))
            sinks.close()  # returns once the SDK flushed: every span and score sent
            export.append(time.perf_counter() - started)
            assert len(receiver.scores) - before >= rollouts
    receiver.close()
    d, w, e = (statistics.median(x) for x in (disk, with_langfuse, export))
    print(
        f"one step of {rollouts} rollouts (3 policy calls + 2 tool calls each), "
        f"median of {args.repeats}"
    )
    print(f"  step waits, disk record only      {d * 1000:8.1f} ms")
    print(f"  step waits, disk + Langfuse sink  {w * 1000:8.1f} ms")
    print(
        f"  Langfuse export on its thread     {e * 1000:8.1f} ms "
        f"({e / rollouts * 1000:.1f} ms per rollout)"
    )
    print(f"  ratio step wait with/without Langfuse: {w / d:.2f}")
    print(f"  ratio export time/step wait: {e / w:.1f}")


if __name__ == "__main__":
    main()
