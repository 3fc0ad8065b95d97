"""Soak `rlcoach serve`: many RL steps while the server and its engine are killed -9.

    python bench/soak_serve.py --steps 110 [--doc docs/faults.md]

A tiny random-weight Llama (the bundled tokenizer and chat template) is served by a real
`rlcoach serve` subprocess on the transformers engine in a process of its own
(`--engine transformers-process`). The client is plain user code: rollouts through
`model.openai_client()` (retried while the server is down), `model.train(groups)` on a
`RemoteBackend`, which retries one request id until the server answers. Meanwhile:
- `serve` is killed -9 at random points of the first steps and started again on the same
  root and port: half of the kills at a random time (during rollouts, uploads, training
  or publishing), half at a random failpoint of the step (core/runtime/failpoints.py: after the
  optimizer step, after the checkpoint's rename, after the publish, after the commit);
- the engine is killed -9 at random points of all the steps (the supervisor restarts it).
`serve` is never killed after the first `--serve-kill-steps`, so the process that serves
step 10 serves to the end, and its memory can be compared.

At the end it checks, from the disk alone: every step was trained exactly once (one
checkpoint per `train` call, numbered 1..N, each holding exactly the trajectories of that
call, none twice), `metrics.jsonl` has one `train` line per step, every uploaded
trajectory is on disk, no checkpoint is torn (every
adapter loads, every step record parses, no temp folder is left once the server has
registered the model again), and the RSS of `serve` at the end is within 10% of its RSS
after step 30. Why step 30, not step 10: the server's RSS grows during its first ~20-30
steps and then stays flat. Its heap log (core/runtime/heap.py, which the soak turns on) shows
the growth is bytes in use, not free memory kept by glibc (the same run with
`MALLOC_ARENA_MAX=2` grows identically); a trainer step run with
`ONEDNN_PRIMITIVE_CACHE_CAPACITY=0`, or in fp32 (`RLCOACH_CPU_BF16=0`), does not grow at
all. It is oneDNN's cache of bf16 kernels, one per new tensor shape, which holds at most
1024 of them (its default capacity): bounded, and full once a run's shapes have been
seen. The growth from step 10 is printed too, and a leak (anything kept per step or per
request) would keep growing after step 30, which the 10% bound over the last 80 steps
catches. It prints the figures (and writes them into `--doc` between the soak
markers). Exit code 1 if a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

from served import ServeProcess  # bench/served.py
from tiny_model import save_tiny_model  # bench/tiny_model.py

from rlcoach.runtime.failpoints import FOLDER_VARIABLE, POINTS, arm
from rlcoach.runtime.heap import LOG_VARIABLE

KEY = "soak-" + os.urandom(8).hex()
START = "<!-- soak:start (written by bench/soak_serve.py --doc) -->"
END = "<!-- soak:end -->"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def heap_in_use(log: Path) -> float:
    """Bytes glibc's heap holds in use in the server (MiB), from its last heap log line."""
    lines = log.read_text().splitlines() if log.is_file() else []
    return json.loads(lines[-1]).get("malloc_in_use_mib", 0.0) if lines else 0.0


async def rollout_group(model, size: int, rng: random.Random, counters: dict) -> object:
    """One group of `size` rollouts with distinct rewards; each chat retried until it
    works (the server or the engine may be down)."""
    from rlcoach import TrajectoryGroup

    client = model.openai_client()
    trajectories = []
    rewards = rng.sample(range(100), size)
    for reward in rewards:
        while True:
            try:
                async with model.rollout() as rollout:
                    await client.chat.completions.create(
                        model=model.name,
                        messages=[{"role": "user", "content": f"Say a number ({rng.random()})."}],
                        max_tokens=6,
                        temperature=1.0,
                    )
                    rollout.reward = reward / 100
                break
            except Exception:
                counters["chat_retries"] += 1
                await asyncio.sleep(0.5)
        trajectories.append(rollout.trajectory)
    return TrajectoryGroup(trajectories)


async def soak(args: argparse.Namespace) -> dict:
    from rlcoach import RemoteBackend, TrainableModel
    from rlcoach.models.bundled import bundled_model_path

    work = Path(tempfile.mkdtemp(prefix="rlcoach-soak-"))
    model_dir = save_tiny_model(work / "tiny-model", bundled_model_path())
    failpoints = work / "failpoints"
    heap_log = work / "heap.jsonl"
    serve = ServeProcess(
        work / "root",
        "transformers-process",
        *("--base-model", str(model_dir), "--max-model-len", "512"),
        key=KEY,
        env={
            "OMP_NUM_THREADS": "1",
            FOLDER_VARIABLE: str(failpoints),
            LOG_VARIABLE: str(heap_log),
            **dict(args.serve_env),
        },
    )
    serve.start()
    rng = random.Random(args.seed)
    counters = {"serve_kills": 0, "engine_kills": 0, "chat_retries": 0}
    kills: list[str] = []
    backend = RemoteBackend(serve.url, KEY, retry_for_s=900, read_timeout_s=60)
    model = TrainableModel("soak", "bench", base_model=str(model_dir))
    while True:
        try:
            await model.register(backend)
            break
        except Exception:
            await asyncio.sleep(0.5)
    uploaded: list[list[str]] = []  # trajectory ids per train call, in order
    rss_after_10 = rss_after_30 = 0.0
    in_use: dict[str, float] = {}
    pid_at_10 = 0
    restarting: asyncio.Task | None = None
    started = time.monotonic()

    async def kill_later(step: int, what: str, delay: float) -> None:
        nonlocal restarting
        if what.startswith("serve at "):  # a failpoint: serve kills itself there
            point = what.removeprefix("serve at ")
            arm(failpoints, point, "kill")
            process = serve.process
            assert process is not None
            await asyncio.to_thread(process.wait, 600)
            counters["serve_kills"] += 1
            kills.append(f"step {step}: serve at {point}")
            await asyncio.sleep(rng.uniform(0.0, 2.0))
            await asyncio.to_thread(serve.start)
            return
        await asyncio.sleep(delay)
        if what == "serve":
            if serve.process is None or serve.process.poll() is not None:
                return
            serve.kill9()
            counters["serve_kills"] += 1
            kills.append(f"step {step}: serve at +{delay:.2f} s")
            await asyncio.sleep(rng.uniform(0.0, 2.0))
            await asyncio.to_thread(serve.start)
        else:
            try:
                pid = await asyncio.to_thread(serve.engine_pid)
            except Exception:  # the server is restarting: no engine to kill now
                return
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                counters["engine_kills"] += 1
                kills.append(f"step {step}: engine at +{delay:.2f} s")

    serve_steps = set(rng.sample(range(1, args.serve_kill_steps + 1), args.serve_kills))
    engine_steps = set(rng.sample(range(2, args.steps + 1), args.engine_kills))
    for step in range(1, args.steps + 1):
        chaos = []
        if step in serve_steps:
            what = "serve" if rng.random() < 0.5 else "serve at " + rng.choice(POINTS[:4])
            chaos.append(asyncio.create_task(kill_later(step, what, rng.uniform(0.0, 3.0))))
        if step in engine_steps:
            chaos.append(asyncio.create_task(kill_later(step, "engine", rng.uniform(0.0, 3.0))))
        groups = [await rollout_group(model, args.group_size, rng, counters) for _ in range(2)]
        uploaded.append([t.id for g in groups for t in g.trajectories])
        result = await model.train(groups)
        if chaos:
            await asyncio.gather(*chaos)
        assert result.step == step, f"train call {step} answered step {result.step}"
        if step == 10:
            rss_after_10 = rss_mib(serve.process.pid)
            pid_at_10 = serve.process.pid
            in_use["10"] = heap_in_use(heap_log)
        if step == 30:
            rss_after_30 = rss_mib(serve.process.pid)
            in_use["30"] = heap_in_use(heap_log)
        if step % 10 == 0:
            print(
                f"step {step}: {time.monotonic() - started:.0f} s, serve RSS "
                f"{rss_mib(serve.process.pid):.0f} MiB, kills {counters}",
                flush=True,
            )
    rss_end = rss_mib(serve.process.pid)
    in_use["end"] = heap_in_use(heap_log)
    engine_rss = rss_mib(serve.engine_pid())
    serve_pid_end = serve.process.pid
    await backend.close()
    # A last restart, as a user would after the run: the model registers again (removing
    # temp folders of killed saves) and must resume from the last step.
    serve.stop()
    serve.start()
    again = TrainableModel("soak", "bench", base_model=str(model_dir))
    other = RemoteBackend(serve.url, KEY)
    await again.register(other)
    await other.close()
    serve.stop()
    figures = check(serve.root / "bench" / "soak", uploaded, again.step)
    figures.update(
        steps=args.steps,
        wall_s=round(time.monotonic() - started),
        serve_rss_after_step_10_mib=round(rss_after_10, 1),
        serve_rss_after_step_30_mib=round(rss_after_30, 1),
        serve_rss_end_mib=round(rss_end, 1),
        serve_rss_growth=round(rss_end / rss_after_10 - 1, 4) if rss_after_10 else None,
        serve_rss_growth_after_step_30=round(rss_end / rss_after_30 - 1, 4)
        if rss_after_30
        else None,
        serve_malloc_in_use_mib={k: round(v, 1) for k, v in in_use.items()},
        engine_rss_end_mib=round(engine_rss, 1),
        serve_same_process_since_step_10=serve_pid_end == pid_at_10,
        kills=kills,
        **counters,
    )
    figures["rss_flat"] = bool(rss_after_30) and rss_end <= rss_after_30 * 1.10
    return figures


def check(run: Path, uploaded: list[list[str]], resumed_step: int) -> dict:
    """What the disk says: exactly-once steps, every trajectory kept, nothing torn."""
    from safetensors.torch import load_file

    folders = sorted(p for p in (run / "checkpoints").iterdir())
    stray = [p.name for p in folders if not p.name.isdigit()]
    steps = [int(p.name) for p in folders if p.name.isdigit()]
    torn = []
    request_ids = []
    for step in steps:
        folder = run / "checkpoints" / f"{step:06d}"
        try:
            load_file(str(folder / "adapter_model.safetensors"))
            json.loads((folder / "adapter_config.json").read_text())
            request_ids.append(json.loads((folder / "rlcoach_step.json").read_text())["request_id"])
        except Exception as e:
            torn.append(f"{step}: {e!r}")
    exact = steps == list(range(1, len(uploaded) + 1)) and len(set(request_ids)) == len(steps)
    mismatched = []
    on_disk: set[str] = set()
    for file in (run / "trajectories").glob("*.jsonl"):
        for line in file.read_text().splitlines():
            on_disk |= {t["id"] for t in json.loads(line)["trajectories"]}
    for step, ids in enumerate(uploaded, start=1):
        file = run / "trajectories" / f"{step:06d}.jsonl"
        lines = file.read_text().splitlines() if file.is_file() else []
        kept = [t["id"] for line in lines for t in json.loads(line)["trajectories"]]
        if sorted(kept) != sorted(ids):
            mismatched.append(step)
    all_ids = [i for ids in uploaded for i in ids]
    missing = [i for i in all_ids if i not in on_disk]
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    trained_lines = sorted(r["step"] for r in metrics if r.get("event") == "train")
    return {
        "checkpoints": len(steps),
        "trained_exactly_once": exact and not mismatched,
        "steps_with_other_trajectories": mismatched,
        "trajectories_uploaded": len(all_ids),
        "trajectories_missing_on_disk": len(missing),
        "torn_checkpoints": torn,
        "stray_folders_after_restart": stray,
        "resumed_step_after_restart": resumed_step,
        "metrics_train_lines": len(trained_lines),
        "metrics_steps_duplicated": len(trained_lines) - len(set(trained_lines)),
    }


def write_doc(doc: Path, figures: dict) -> None:
    lines = [
        START,
        "```",
        json.dumps({k: v for k, v in figures.items() if k != "kills"}, indent=1),
        "kills: " + "; ".join(figures["kills"]),
        "```",
        END,
    ]
    text = doc.read_text(encoding="utf-8")
    block = "\n".join(lines)
    if START in text and END in text:
        text = text.split(START, 1)[0] + block + text.split(END, 1)[1]
    else:
        text += "\n" + block + "\n"
    doc.write_text(text, encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=110)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--serve-kills", type=int, default=6)
    parser.add_argument("--serve-kill-steps", type=int, default=9)
    parser.add_argument("--engine-kills", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--doc", type=Path, default=None)
    parser.add_argument(
        "--serve-env",
        type=lambda text: tuple(text.split("=", 1)),
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="add to the server's environment (e.g. RLCOACH_HEAP_LOG=/tmp/heap.jsonl, "
        "MALLOC_ARENA_MAX=2, PYTHONTRACEMALLOC=1); repeatable",
    )
    args = parser.parse_args()
    figures = asyncio.run(soak(args))
    print(json.dumps(figures, indent=1))
    ok = (
        figures["trained_exactly_once"]
        and figures["trajectories_missing_on_disk"] == 0
        and not figures["torn_checkpoints"]
        and not figures["stray_folders_after_restart"]
        and figures["rss_flat"]
        and figures["metrics_train_lines"] == figures["steps"]
        and figures["metrics_steps_duplicated"] == 0
        and figures["serve_kills"] + figures["engine_kills"] >= 10
    )
    print("SOAK", "PASSED" if ok else "FAILED")
    if args.doc is not None:
        write_doc(args.doc, figures)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
