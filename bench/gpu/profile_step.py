"""Where one whole RL step's time goes: a CPU timeline of the step and a torch.profiler
trace of its train step, for bench/gpu/step.py (`--profile`).

`StepRecorder.install(backend)` wraps, on that backend and the trainer class, the parts of
`LocalBackend.train` that take time, and records each call's wall-clock span:
rendering the trajectories into token sequences (`_render`), the trainer's step, writing
the adapter (`write_uncommitted`, fsync included), publishing it (the step result's
`publish_seconds`, which starts when the write ends) and the optimizer state written
beside the publish. While `profiling` is set, the trainer's step runs under
`torch.profiler` in the trainer's own thread (the profiler records CPU operators only on
the thread that starts it; CUDA kernels from every thread), with the step's
`record_function` labels (trainer/step.py: sequences, pack_rows, old_logprobs, forward,
backward, clip_and_read, optimizer).

`summarize_profile` reads the raw Kineto events (not the profiler's per-event Python
objects, which take minutes to build for the ~10^6 events of a step): GPU busy time (the
union of kernels, copies and sets) against the step's wall time, the CPU time under each
label, the GPU's idle time attributed to the label the trainer thread was in when the
GPU went idle, host<->device copies, waits for the device (stream/device/event
synchronisations and `aten::_local_scalar_dense`, what `.item()` and `float(tensor)`
call), kernel launches, and the largest kernels. Everything here is measurement: the
wrapped functions are called unchanged.
"""

from __future__ import annotations

import bisect
import functools
import time
from collections import defaultdict
from typing import Any

GPU_ACTIVITIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


class StepRecorder:
    """Wall-clock spans (name, start ns, end ns) of a step's parts, and the profile of the
    trainer step run while `profiling` is set."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, int, int]] = []
        self.profiling = False
        self.events: list[Any] | None = None

    def _timed(self, name: str, call: Any) -> Any:
        @functools.wraps(call)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.time_ns()
            try:
                return call(*args, **kwargs)
            finally:
                self.spans.append((name, start, time.time_ns()))

        return timed

    def install(self, backend: Any) -> StepRecorder:
        import rlcoach.backend.step_commit as step_commit
        from rlcoach.trainer.lora import LoraTrainer

        steps = backend.steps  # the step runner (rlcoach.backend.step)
        steps._render = self._timed("render", steps._render)
        step_commit.write_uncommitted = self._timed("write adapter", step_commit.write_uncommitted)
        LoraTrainer.save_optimizer = self._timed("save optimizer", LoraTrainer.save_optimizer)
        plain_step = LoraTrainer.step
        recorder = self

        def step(trainer: Any, *args: Any, **kwargs: Any) -> Any:
            if not recorder.profiling:
                return recorder._timed("train step", plain_step)(trainer, *args, **kwargs)
            import torch
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
                torch.cuda.synchronize()
            with profile(activities=activities) as prof:
                result = recorder._timed("train step", plain_step)(trainer, *args, **kwargs)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
            recorder.events = list(prof.profiler.kineto_results.events())
            return result

        LoraTrainer.step = step
        return self

    def clear(self) -> None:
        self.spans.clear()
        self.events = None


def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _kind(event: Any) -> str:
    """Kineto's activity type; torch 2.11's events lack `activity_type`, so it is told
    from the device, the annotation flag and the name there."""
    if hasattr(event, "activity_type"):
        return str(event.activity_type())
    name = event.name()
    if "CUDA" in str(event.device_type()):
        if event.is_user_annotation():
            return "gpu_user_annotation"
        if name.startswith("Memcpy"):
            return "gpu_memcpy"
        return "gpu_memset" if name.startswith("Memset") else "kernel"
    if event.is_user_annotation():
        return "user_annotation"
    if name.startswith(("cuda", "cu")) and "::" not in name:
        return "cuda_runtime"
    return "cpu_op"


def summarize_profile(events: list[Any], window: tuple[int, int]) -> dict[str, Any]:
    """The profile of one train step (see the module docstring); times in ms."""
    start, end = window
    wall = max(end - start, 1)
    gpu: list[tuple[int, int]] = []
    labels: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    label_spans: list[tuple[int, int, str]] = []
    copies: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    syncs: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    kernels: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    launches = 0
    for event in events:
        kind, name = _kind(event), event.name()
        a, duration = event.start_ns(), event.duration_ns()
        if kind in GPU_ACTIVITIES:
            gpu.append((a, a + duration))
            if kind == "gpu_memcpy":
                copies[name][0] += 1
                copies[name][1] += duration / 1e6
            elif kind == "kernel":
                kernels[name[:80]][0] += 1
                kernels[name[:80]][1] += duration / 1e6
        elif kind == "user_annotation" and name.startswith("rlcoach."):
            labels[name][0] += 1
            labels[name][1] += duration / 1e6
            label_spans.append((a, a + duration, name))
        elif kind in ("cuda_runtime", "cuda_driver"):
            if "ynchronize" in name:
                syncs[name][0] += 1
                syncs[name][1] += duration / 1e6
            elif name in LAUNCHES or name == "cudaGraphLaunch":
                launches += 1
        elif kind == "cpu_op" and name in ("aten::_local_scalar_dense", "aten::item"):
            syncs[name][0] += 1
            syncs[name][1] += duration / 1e6
    busy = [(max(a, start), min(b, end)) for a, b in _union(gpu) if b > start and a < end]
    busy_ns = sum(b - a for a, b in busy)
    # Idle stretches of the GPU inside the step, each charged to the innermost label the
    # trainer thread was in at the stretch's middle ("no label": bookkeeping between).
    idle = []
    cursor = start
    for a, b in busy:
        if a > cursor:
            idle.append((cursor, a))
        cursor = max(cursor, b)
    if end > cursor:
        idle.append((cursor, end))
    label_spans.sort()
    starts = [s[0] for s in label_spans]
    idle_by: dict[str, float] = defaultdict(float)
    for a, b in idle:
        middle = (a + b) // 2
        inside = [s for s in label_spans[: bisect.bisect_right(starts, middle)] if s[1] >= middle]
        owner = min(inside, key=lambda s: s[1] - s[0])[2] if inside else "no label"
        idle_by[owner] += (b - a) / 1e6
    top = sorted(kernels.items(), key=lambda item: -item[1][1])[:12]
    return {
        "wall_ms": wall / 1e6,
        "gpu_busy_ms": busy_ns / 1e6,
        "gpu_busy_pct": 100 * busy_ns / wall,
        "labels_ms": {k: {"calls": int(c), "ms": round(t, 2)} for k, (c, t) in labels.items()},
        "gpu_idle_ms_by_label": {k: round(v, 2) for k, v in sorted(idle_by.items())},
        "copies": {k: {"count": int(c), "ms": round(t, 2)} for k, (c, t) in copies.items()},
        "syncs": {k: {"count": int(c), "ms": round(t, 2)} for k, (c, t) in syncs.items()},
        "kernel_launches": launches,
        "kernels": sum(int(c) for c, _ in kernels.values()),
        "top_kernels": [{"name": k, "count": int(c), "ms": round(t, 2)} for k, (c, t) in top],
    }


def step_timeline(
    spans: list[tuple[str, int, int]],
    rollout: tuple[int, int],
    step_end: int,
    publish_seconds: float,
) -> dict[str, float]:
    """Seconds of each part of one step, from the rollouts' start to the end of
    `model.train`: the recorded spans, the publish (after the adapter's write), and the
    rest of `train` ("other": sinks, staleness, the commit's bookkeeping)."""
    parts: dict[str, float] = {"rollouts": (rollout[1] - rollout[0]) / 1e9}
    for name, a, b in spans:
        parts[name] = parts.get(name, 0.0) + (b - a) / 1e9
    parts["publish"] = publish_seconds
    train = (step_end - rollout[1]) / 1e9
    inside = sum(v for k, v in parts.items() if k not in ("rollouts", "save optimizer"))
    parts["other (train call)"] = max(train - inside, 0.0)
    parts["whole step"] = (step_end - rollout[0]) / 1e9
    return {k: round(v, 3) for k, v in parts.items()}


def format_profile(timeline: dict[str, float], profile: dict[str, Any] | None) -> str:
    lines = ["profiled step (sync): " + ", ".join(f"{k} {v:.3f} s" for k, v in timeline.items())]
    if profile:
        lines.append(
            f"  train step under torch.profiler: wall {profile['wall_ms']:.0f} ms, GPU busy "
            f"{profile['gpu_busy_ms']:.0f} ms ({profile['gpu_busy_pct']:.0f}%), "
            f"{profile['kernels']} kernels, {profile['kernel_launches']} launches"
        )
        lines.append(f"  CPU time under labels: {profile['labels_ms']}")
        lines.append(f"  GPU idle by label (ms): {profile['gpu_idle_ms_by_label']}")
        lines.append(f"  copies: {profile['copies']}")
        lines.append(f"  syncs: {profile['syncs']}")
        for kernel in profile["top_kernels"]:
            lines.append(f"    {kernel['ms']:9.1f} ms {kernel['count']:6d}x {kernel['name']}")
    return "\n".join(lines)
