"""The whole RL step on one GPU: rollouts, a train step, a publish, repeated, side by side.

Four ways to run the same loop on the same model, each in its own process (so each
starts with the GPU to itself), in one command:

- sync: `run_pipeline(overlap=False)` on a `LocalBackend`: vLLM (split memory,
  `--split-util`) and the trainer resident; a batch is sampled, then trained, then the
  adapter is published, then the next batch is sampled.
- async: the same backend and process as sync (one vLLM start for both),
  `run_pipeline(overlap=True)`: batch k+1 is sampled while step k trains
  (`max_staleness=1`).
- colocated: `EngineConfig(colocation="sleep")` with `--sleep-util`: vLLM sleeps
  (level 1) around each training step, the trainer gets the GPU, rollouts wait.
- trl: TRL's `GRPOTrainer` with its vLLM colocate mode (`use_vllm=True,
  vllm_mode="colocate"`, `vllm_gpu_memory_utilization=--split-util`), its defaults
  otherwise, on the same model folder, prompts, lengths, group size, LoRA and reward.

A step is `--groups` x `--group-size` rollouts (256 by default: 32 prompts x 8), each
one chat completion through the policy endpoint (`model.openai_client()`, recorded in
a rollout scope) of a ~`--prompt-tokens`-token prompt and exactly `--completion-tokens`
sampled tokens (`ignore_eos`), scored by `reward()` (the share of the letter "e" in the
completion: same code, same cost on both sides); then one optimizer step on all of them
(micro-batches of `--micro-batch-seqs` sequences on both sides), then the publish. One
warm-up step (compiling, allocator) is not timed; `--steps` steps are.

Measured per mode: seconds per step and RL steps per hour over the timed steps; GPU
busy % from NVML (`torch.cuda.utilization`, else `nvidia-smi -lms`), sampled every 100
ms, overall and per phase of the timeline (rollout only, train only, both at once,
publish, sleep/wake, idle); trainer and generation tokens/s; publish and sleep/wake
seconds; staleness; peak memory beside the estimate of `rlcoach.runtime.memory` for the mode.
An ASCII strip per mode shows the timeline (R rollout, T train, B both, P publish, S
sleep/wake, . idle; the digit under it is GPU busy in tenths).

vLLM on both sides runs CUDA graphs without inductor (`--vllm graphs`, the default:
`compilation_config={"backend": "eager"}`, vLLM's fused custom ops, piecewise graphs
captured at start-up): an inductor compile costs ~140 s per vLLM start on the H200 and
four starts must fit in one 10-minute command, while running without graphs (`--vllm
eager`, `enforce_eager`) leaves decoding bound by kernel launches (the GPU was 17-22%
busy during rollouts that way, LoRA's extra kernels hurting most). `--vllm compiled` is
vLLM's own default (inductor and graphs). TRL's colocated `LLM` gets the same setting
through a wrapper around its constructor. vLLM gets `--max-num-seqs` = the rollouts per
step and `--max-num-batched-tokens 4096`, as TRL sets for its own engine.

  # on the GPU machine (bench/gpu/device.sh p1, p2, p3 first; then `source ... env`)
  python bench/gpu/step.py --shape 4b --tokenizer .gpu/tok --out $OUT
  # on a CPU: the same code end to end with a tiny model and tiny sizes (~30 s)
  python bench/gpu/step.py --tiny
  # the memory plan of each Qwen3 shape and mode at 16K tokens per step (no GPU needed)
  python bench/gpu/step.py fit
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from profile_step import StepRecorder, format_profile, step_timeline, summarize_profile  # noqa: E402
from shapes import SHAPES, TIED, make_model  # noqa: E402

WORDS = [
    "robot",
    "river",
    "garden",
    "lantern",
    "copper",
    "violet",
    "engine",
    "summer",
    "marble",
    "harbor",
    "thunder",
    "pepper",
    "canyon",
    "meadow",
    "silver",
    "falcon",
    "orbit",
    "maple",
    "quartz",
    "willow",
    "ember",
    "glacier",
    "prism",
    "tundra",
]
GRAPHS_NO_INDUCTOR = {"backend": "eager"}
"""vLLM's compilation setting for `--vllm graphs`: piecewise CUDA graphs, no inductor."""
PHASES = ("rollout", "train", "both", "publish", "sleep/wake", "idle")
VLLM_LABELS = {
    "eager": "eager (no CUDA graphs)",
    "graphs": "with CUDA graphs, no inductor",
    "compiled": "compiled (inductor) with CUDA graphs",
}
LETTERS = {"rollout": "R", "train": "T", "both": "B", "publish": "P", "sleep/wake": "S"}


def mean(values: Any) -> float | None:
    values = list(values)
    return statistics.mean(values) if values else None


def reward(text: str) -> float:
    """The share of the letter "e": cheap, and it varies between random completions."""
    return text.count("e") / max(len(text), 1)


def _reply_text(message: Any) -> str:
    """All the text a reply carries. A reasoning parser (Qwen3's) moves text without a
    closing think tag into `reasoning_content`: scored on `content` alone, every reply of a
    random-weight model would score 0, every group would tie and no step would train."""
    extra = message.model_extra or {}
    thinking = extra.get("reasoning_content") or extra.get("reasoning") or ""
    return thinking + (message.content or "")


def prompts(args: argparse.Namespace, index: int) -> list[str]:
    """The batch's prompts, the same for every mode and for TRL (seeded by the index)."""
    rng = random.Random(1000 + index)
    words = max(args.prompt_tokens * 3 // 4, 1)  # the tokenizer makes ~1.3 tokens a word
    return [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(args.groups)]


# -- GPU utilization sampling -------------------------------------------------------------


class GpuSampler:
    """(time, busy %, memory used MiB) every `interval` seconds from NVML, in a thread.
    Without a GPU it records the clock alone (busy is None), so the timeline still has
    its time axis."""

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self.samples: list[tuple[float, float | None, float | None]] = []
        self.source = "none"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="gpu-sampler")
        self._smi: subprocess.Popen[str] | None = None

    def start(self) -> GpuSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._smi is not None:
            self._smi.terminate()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        import torch

        if not torch.cuda.is_available():
            while not self._stop.wait(self.interval):
                self.samples.append((time.perf_counter(), None, None))
            return
        try:
            torch.cuda.utilization(0)
            torch.cuda.device_memory_used(0)
            self.source = "nvml"
            while not self._stop.wait(self.interval):
                busy = float(torch.cuda.utilization(0))
                used = torch.cuda.device_memory_used(0) / 2**20
                self.samples.append((time.perf_counter(), busy, used))
            return
        except Exception:  # no pynvml: nvidia-smi streams the same counters
            pass
        self.source = "nvidia-smi"
        index = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
        self._smi = subprocess.Popen(
            [
                "nvidia-smi",
                "--query-gpu=utilization.gpu,memory.used",
                "--format=csv,noheader,nounits",
                f"-lms={int(self.interval * 1000)}",
                f"-i={index}",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._smi.stdout is not None
        for line in self._smi.stdout:
            if self._stop.is_set():
                break
            try:
                busy, used = (float(x) for x in line.split(","))
            except ValueError:
                continue
            self.samples.append((time.perf_counter(), busy, used))

    def window(self, start: float, end: float) -> list[tuple[float, float | None, float | None]]:
        inside = [s for s in self.samples if start <= s[0] <= end]
        if inside:
            return inside
        steps = max(int((end - start) / self.interval), 1)  # too short a window
        return [(start + (i + 0.5) * (end - start) / steps, None, None) for i in range(steps)]


def summarize(
    segments: list[tuple[float, float, str]],
    sampler: GpuSampler,
    start: float,
    end: float,
    steps: int,
) -> dict[str, Any]:
    """Steps per hour, GPU busy overall and per phase, and an ASCII strip of the window."""
    samples = sampler.window(start, end)

    def phase_at(t: float) -> str:
        active = {p for a, b, p in segments if a <= t < b}
        if "sleep/wake" in active:
            return "sleep/wake"
        if "publish" in active:
            return "publish"
        if "rollout" in active and "train" in active:
            return "both"
        return next((p for p in ("train", "rollout") if p in active), "idle")

    labelled = [(t, busy, phase_at(t)) for t, busy, _ in samples]
    phases = {}
    for phase in PHASES:
        mine = [busy for _, busy, p in labelled if p == phase]
        known = [b for b in mine if b is not None]
        phases[phase] = {
            "share": len(mine) / len(labelled),
            "busy_pct": statistics.mean(known) if known else None,
        }
    known = [busy for _, busy, _ in labelled if busy is not None]
    width = 100
    strip, level = [], []
    for i in range(width):
        a, b = start + i * (end - start) / width, start + (i + 1) * (end - start) / width
        cell = [(busy, p) for t, busy, p in labelled if a <= t < b] or [
            (None, phase_at((a + b) / 2))
        ]
        phase = max({p for _, p in cell}, key=[p for _, p in cell].count)
        strip.append(LETTERS.get(phase, "."))
        values = [x for x, _ in cell if x is not None]
        level.append(str(min(int(statistics.mean(values) / 10), 9)) if values else " ")
    memory = [used for _, _, used in samples if used is not None]
    return {
        "seconds_per_step": (end - start) / steps,
        "steps_per_hour": 3600 * steps / (end - start),
        "gpu_busy_pct": statistics.mean(known) if known else None,
        "phases": phases,
        "strip": "".join(strip),
        "busy_strip": "".join(level),
        "gpu_memory_used_max_gib": max(memory) / 1024 if memory else None,
        "sampler": sampler.source,
    }


# -- our loop -----------------------------------------------------------------------------


def _train_config(args: argparse.Namespace) -> dict[str, Any]:
    sequence = args.prompt_tokens + args.completion_tokens + 32  # + the chat template
    return {
        "learning_rate": 1e-5,
        "micro_batch_tokens": max(args.micro_batch_seqs * sequence, 64),
        "lora": {"rank": 16, "alpha": 32},
        "max_staleness": 1,
    }


def _engine_config(args: argparse.Namespace, colocated: bool) -> dict[str, Any]:
    if args.engine == "transformers":
        return {"kind": "transformers", "colocation": "sleep" if colocated else "split"}
    extra = [
        "--max-num-seqs",
        str(args.groups * args.group_size),
        "--max-num-batched-tokens",
        "4096",
    ]
    if args.vllm == "eager":
        extra.append("--enforce-eager")
    elif args.vllm == "graphs":
        extra += ["--compilation-config", json.dumps(GRAPHS_NO_INDUCTOR)]
    return {
        "kind": "vllm",
        "max_model_len": args.prompt_tokens * 2 + args.completion_tokens + 256,
        "max_loras": 2,
        "max_lora_rank": 16,
        "gpu_memory_utilization": args.sleep_util if colocated else args.split_util,
        "colocation": "sleep" if colocated else "split",
        "startup_timeout_s": 900.0,
        "extra_args": extra,
    }


def _segments(steps: list[Any]) -> list[tuple[float, float, str]]:
    """The timeline of a run: rollouts, and each `model.train` cut into its phases in
    their order (sleep, train, wake, save + publish; the rest, bookkeeping, is train)."""
    segments = []
    for step in steps:
        segments.append((step.rollout_start, step.rollout_end, "rollout"))
        if step.result is None:
            segments.append((step.train_start, step.train_end, "train"))
            continue
        t = step.train_start
        sleep = step.result.timings.get("sleep_seconds", 0.0)
        wake = step.result.timings.get("wake_seconds", 0.0)
        train = step.result.stats.seconds
        publish = step.result.save_seconds + step.result.publish_seconds
        for seconds, phase in ((sleep, "sleep/wake"), (train, "train"), (wake, "sleep/wake")):
            segments.append((t, t + seconds, phase))
            t += seconds
        segments.append((t, t + publish, "publish"))
        segments.append((t + publish, step.train_end, "train"))
    return segments


async def run_ours(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from rlcoach import LocalBackend, TrainableModel, gather_trajectory_groups, run_pipeline
    from rlcoach.errors import ConfigError

    colocated = args.modes == ["colocated"]
    sampler = GpuSampler().start()
    root = Path(tempfile.mkdtemp(prefix="rlcoach-step-"))
    results: dict[str, Any] = {}
    started = time.perf_counter()
    backend = LocalBackend(root, engine=_engine_config(args, colocated))
    # The profiled step runs after the timed ones, in the sync process only.
    recorder = StepRecorder().install(backend) if args.profile and "sync" in args.modes else None
    try:
        model = TrainableModel("bench", "step", base_model=args.model, config=_train_config(args))
        try:
            await model.register(backend)
        except ConfigError as e:  # e.g. no sleep mode on a CPU: reported, not a crash
            for mode in args.modes:
                print(f"MODE {mode} " + json.dumps({"refused": str(e)}), flush=True)
            return {}
        startup = time.perf_counter() - started
        client = model.openai_client()
        extra = {"ignore_eos": True} if args.engine == "vllm" else {}
        lengths: dict[int, tuple[float, float]] = {}
        split: dict[int, tuple[float, float, float]] = {}

        async def rollout(prompt: str):
            async with model.rollout() as scope:
                reply = await client.chat.completions.create(
                    model=model.name,
                    messages=[{"role": "user", "content": prompt}],
                    max_tokens=args.completion_tokens,
                    temperature=1.0,
                    extra_body=extra,
                )
                scope.reward = reward(_reply_text(reply.choices[0].message))
            return scope.trajectory

        async def batch(index: int):
            began = time.time()
            groups = await gather_trajectory_groups(
                [[rollout(p) for _ in range(args.group_size)] for p in prompts(args, index)],
                max_concurrency=args.groups * args.group_size,
                progress=False,
            )
            ended = time.time()
            choices = [c for g in groups for t in g.trajectories for c in t.choices]
            lengths[index] = (
                statistics.mean(len(c.prompt_token_ids) for c in choices),
                statistics.mean(len(c.token_ids) for c in choices),
            )
            # Where the rollout phase goes: before the endpoint has the first request, from
            # it to the engine's last answer (the endpoint's own timing), and after it.
            first = min(c.started_at for c in choices if c.started_at is not None)
            last = max(
                c.started_at + (c.latency_s or 0.0) for c in choices if c.started_at is not None
            )
            split[index] = (first - began, last - first, ended - last)
            return groups

        for mode in args.modes:
            overlap = {"sync": False, "async": True}.get(mode)  # colocated: the backend's
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            steps = await run_pipeline(
                model, batch, until_step=model.step + 1 + args.steps, overlap=overlap
            )
            failed = [s.error for s in steps if s.error]
            timed = steps[1:]
            if not any(s.result is not None and s.result.stats.total_tokens for s in timed):
                failed.append("no timed step trained a token: the train phase is not measured")
            summary = summarize(
                _segments(steps), sampler, steps[0].train_end, steps[-1].train_end, len(timed)
            )
            trained = [s.result for s in timed if s.result is not None]
            rollouts = [s.rollout_end - s.rollout_start for s in timed]
            summary.update(
                startup_s=startup,
                warmup_step_s=steps[0].train_end - steps[0].rollout_start,
                failed=failed,
                lags=[s.lag for s in steps],
                stale_dropped=sum(r.staleness.stale_dropped for r in trained if r.staleness),
                train_step_s=mean(r.stats.seconds for r in trained),
                trainer_tok_s=sum(r.stats.total_tokens for r in trained)
                / max(sum(r.stats.seconds for r in trained), 1e-9),
                rollout_s=mean(rollouts),
                rollout_split_s={
                    part: mean(split[s.index][i] for s in timed if s.index in split)
                    for i, part in enumerate(("to_first_request", "engine", "after_last_answer"))
                },
                generated_tok_s=mean(
                    args.groups * args.group_size * lengths[s.index][1] / seconds
                    for s, seconds in zip(timed, rollouts, strict=True)
                ),
                publish_s=mean(r.save_seconds + r.publish_seconds for r in trained),
                sleep_s=mean(r.timings.get("sleep_seconds", 0.0) for r in trained),
                wake_s=mean(r.timings.get("wake_seconds", 0.0) for r in trained),
                prompt_tokens=mean(lengths[s.index][0] for s in timed),
                completion_tokens=mean(lengths[s.index][1] for s in timed),
                trainer_peak_gib=torch.cuda.max_memory_allocated() / 2**30
                if torch.cuda.is_available()
                else None,
                plan=_plan(args, "sleep" if colocated else "split"),
                engine_http=getattr(getattr(backend.engine, "_client", None), "backend", None),
            )
            results[mode] = summary
            print(f"MODE {mode} " + json.dumps(summary), flush=True)
        if recorder is not None:
            results["profile"] = await _profiled_step(model, batch, recorder)
            print("MODE profile " + json.dumps(results["profile"]), flush=True)
    finally:
        sampler.stop()
        await backend.close()
    return results


async def _profiled_step(model: Any, batch: Any, recorder: StepRecorder) -> dict[str, Any]:
    """One more synchronous step, its train step under torch.profiler (profile_step.py);
    after the timed steps, so the profiler's own cost is in none of them."""
    from rlcoach import run_pipeline

    recorder.clear()
    recorder.profiling = True
    try:
        [step] = await run_pipeline(model, batch, until_step=model.step + 1, overlap=False)
    finally:
        recorder.profiling = False
    if step.result is None:
        return {"failed": step.error}
    to_ns = time.time_ns() - time.perf_counter_ns()  # perf_counter marks onto the wall clock
    rollout = (int(step.rollout_start * 1e9) + to_ns, int(step.rollout_end * 1e9) + to_ns)
    end = int(step.train_end * 1e9) + to_ns
    spans = [s for s in recorder.spans if s[1] >= rollout[0]]
    timeline = step_timeline(spans, rollout, end, step.result.publish_seconds)
    began = time.perf_counter()
    train = next((a, b) for name, a, b in spans if name == "train step")
    profile = summarize_profile(recorder.events or [], train) if recorder.events else None
    result = {
        "timeline_s": timeline,
        "trainer": profile,
        "trained_tokens": step.result.stats.total_tokens,
        "analysis_s": round(time.perf_counter() - began, 1),
    }
    print(format_profile(timeline, profile), flush=True)
    return result


def _plan(args: argparse.Namespace, colocation: str) -> dict[str, Any] | None:
    """`rlcoach.runtime.memory`'s estimate for this mode, to print beside the measured peaks."""
    import torch

    if not torch.cuda.is_available():
        return None
    from rlcoach.runtime.memory import ModelShape, plan_memory

    engine = _engine_config(args, colocation == "sleep")
    plan = plan_memory(
        ModelShape.from_folder(args.model),
        gpu_bytes=torch.cuda.get_device_properties(0).total_memory,
        colocation=colocation,
        gpu_memory_utilization=engine["gpu_memory_utilization"],
        max_model_len=engine["max_model_len"],
        max_loras=2,
        max_lora_rank=16,
        lora_rank=16,
        micro_batch_tokens=_train_config(args)["micro_batch_tokens"],
        logprob_chunk_tokens=1024,
        activation_checkpointing=False,
        compiled_layers=True,
    )
    return {k: v / 2**30 if k.endswith("bytes") else v for k, v in plan.as_dict().items()}


# -- TRL ----------------------------------------------------------------------------------


def run_trl(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import trl
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    gpu = torch.cuda.is_available()
    if gpu and args.vllm != "compiled":  # the same vLLM setting as ours (module docstring)
        import trl.generation.vllm_generation as generation

        real_llm = generation.LLM
        setting = (
            {"enforce_eager": True}
            if args.vllm == "eager"
            else {"compilation_config": dict(GRAPHS_NO_INDUCTOR)}
        )

        def same_llm(*a: Any, **k: Any) -> Any:
            return real_llm(*a, **{**k, **setting})

        generation.LLM = same_llm
    sampler = GpuSampler().start()
    rollouts = args.groups * args.group_size
    rows = [
        {"prompt": [{"role": "user", "content": p}]}
        for index in range(args.steps + 1)
        for p in prompts(args, index)
    ]
    ends: list[float] = []
    segments: list[tuple[float, float, str]] = []

    class Marks(TrainerCallback):
        def on_step_end(self, *_: Any, **__: Any) -> None:
            if gpu:
                torch.cuda.synchronize()
            ends.append(time.perf_counter())

    def scored(completions: list[Any], **_: Any) -> list[float]:
        return [reward(c[0]["content"] if isinstance(c, list) else str(c)) for c in completions]

    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-step-"),
        per_device_train_batch_size=args.micro_batch_seqs,
        gradient_accumulation_steps=rollouts // args.micro_batch_seqs,
        num_generations=args.group_size,
        max_completion_length=args.completion_tokens,
        temperature=1.0,
        learning_rate=1e-5,
        beta=0.0,
        bf16=gpu,
        use_cpu=not gpu,
        max_steps=args.steps + 1,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        use_vllm=gpu,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=args.split_util,
        vllm_max_model_length=args.prompt_tokens * 2 + args.completion_tokens + 256,
        generation_kwargs={"ignore_eos": True}
        if gpu
        else {"min_new_tokens": args.completion_tokens},
        shuffle_dataset=False,
        seed=0,
    )
    started = time.perf_counter()
    trainer = GRPOTrainer(
        model=args.model,
        reward_funcs=scored,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(args.model),
        peft_config=LoraConfig(
            r=16,
            lora_alpha=32,
            target_modules=[
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "gate_proj",
                "up_proj",
                "down_proj",
            ],
        ),
        callbacks=[Marks()],
    )
    startup = time.perf_counter() - started
    generate = trainer._generate

    def timed_generate(*a: Any, **k: Any) -> Any:  # measured, not changed
        begin = time.perf_counter()
        try:
            return generate(*a, **k)
        finally:
            segments.append((begin, time.perf_counter(), "rollout"))

    trainer._generate = timed_generate
    try:
        trainer.train()
    finally:
        sampler.stop()
    # Everything of a step that is not generation is training (weight sync included).
    first = ends[0] - (ends[1] - ends[0]) if len(ends) > 1 else started
    bounds = [first, *ends]
    for a, b in itertools.pairwise(bounds):
        inside = [s for s in segments if a <= s[0] < b]
        cursor = a
        for s in sorted(inside):
            if s[0] > cursor:
                segments.append((cursor, s[0], "train"))
            cursor = max(cursor, s[1])
        segments.append((cursor, b, "train"))
    summary = summarize(segments, sampler, ends[0], ends[-1], len(ends) - 1)
    summary.update(
        trl=trl.__version__,
        startup_s=startup,
        gradient_checkpointing=bool(trainer.args.gradient_checkpointing),
        trainer_peak_gib=torch.cuda.max_memory_allocated() / 2**30 if gpu else None,
        rollout_s=mean(b - a for a, b, p in segments if p == "rollout" and a >= ends[0]),
        generation="vLLM colocate" if gpu else "transformers (no vLLM colocate on a CPU)",
    )
    print("MODE trl " + json.dumps(summary), flush=True)
    return {"trl": summary}


# -- the parent: children, then the table -------------------------------------------------


def _child(args: argparse.Namespace, modes: list[str], timeout: float) -> dict[str, Any]:
    """Run `modes` in a child process; collect each mode's `MODE <name> <json>` line,
    also from a child that failed or ran out of time after some modes finished."""
    command = [sys.executable, __file__, "one", "--modes", ",".join(modes), *args.child_args]
    started = time.perf_counter()
    status = "ok"
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        stdout, output = done.stdout, done.stdout + done.stderr
        if done.returncode != 0:
            status = f"exit {done.returncode}"
    except subprocess.TimeoutExpired as e:
        stdout = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else ""
        stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else ""
        output, status = stdout + stderr, f"timed out after {timeout:.0f} s"
    print(f"[{'+'.join(modes)}] {status}, {time.perf_counter() - started:.0f} s", flush=True)
    if args.out:
        (Path(args.out) / f"step-{'-'.join(modes)}.log").write_text(output)
    results = {}
    for line in stdout.splitlines():
        if line.startswith("MODE "):
            name, _, data = line[len("MODE ") :].partition(" ")
            results[name] = json.loads(data)
    if status != "ok":
        tail = "\n  ".join(output.strip().splitlines()[-15:])
        print(f"[{'+'.join(modes)}] {status}:\n  {tail}", flush=True)
    for mode in modes:
        results.setdefault(mode, {"failed": status})
    return results


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _pct(value: float | None) -> str:
    return "    -" if value is None else f"{value:4.0f}%"


def report(results: dict[str, Any], args: argparse.Namespace) -> None:
    results = dict(results)
    profile = results.pop("profile", None)
    print(
        f"\nwhole RL step, {args.shape_label}: {args.groups * args.group_size} rollouts "
        f"({args.groups} x {args.group_size}) of ~{args.prompt_tokens} prompt + "
        f"{args.completion_tokens} completion tokens, LoRA r16, {args.steps} timed steps "
        f"after a warm-up; vLLM {VLLM_LABELS[args.vllm]}"
    )
    header = f"{'mode':10} {'s/step':>7} {'steps/h':>8} {'GPU busy':>8}  " + " ".join(
        f"{p:>13}" for p in PHASES
    )
    print(header + f" {'train tok/s':>11} {'gen tok/s':>9}")
    for mode, r in results.items():
        if "seconds_per_step" not in r:
            print(f"{mode:10} {r.get('refused') or r.get('failed')}")
            continue
        cells = []
        for phase in PHASES:
            p = r["phases"][phase]
            seconds = p["share"] * r["seconds_per_step"]
            cells.append(f"{seconds:6.1f}s {_pct(p['busy_pct'])}")
        print(
            f"{mode:10} {r['seconds_per_step']:7.2f} {r['steps_per_hour']:8.0f} "
            f"{_pct(r['gpu_busy_pct']):>8}  "
            + " ".join(f"{c:>13}" for c in cells)
            + f" {_num(r.get('trainer_tok_s')):>11} {_num(r.get('generated_tok_s')):>9}"
        )
    print("(phase cells: seconds per step in that phase, GPU busy % during it)")
    for mode, r in results.items():
        if "strip" in r:
            print(f"{mode:10} |{r['strip']}|\n{'':10} |{r['busy_strip']}|")
    for mode, r in results.items():
        if "seconds_per_step" not in r:
            continue
        extra = {
            k: round(v, 3) if isinstance(v, float) else v
            for k, v in r.items()
            if k
            in (
                "startup_s",
                "warmup_step_s",
                "train_step_s",
                "rollout_s",
                "rollout_split_s",
                "publish_s",
                "sleep_s",
                "wake_s",
                "lags",
                "stale_dropped",
                "prompt_tokens",
                "completion_tokens",
                "trainer_peak_gib",
                "gpu_memory_used_max_gib",
                "gradient_checkpointing",
                "generation",
                "engine_http",
                "failed",
            )
        }
        print(f"{mode}: {json.dumps(extra)}")
        if r.get("plan"):
            plan = r["plan"]
            print(
                f"  memory plan ({plan['colocation']}): vLLM {plan['engine_bytes']:.1f} GiB, "
                f"trainer peak {plan['trainer_peak_bytes']:.1f} GiB estimated, "
                f"fits={plan['fits']}"
            )
    if profile and "timeline_s" in profile:
        print(format_profile(profile["timeline_s"], profile.get("trainer")))
    elif profile:
        print(f"profiled step: {profile.get('failed')}")
    rate = {m: r["steps_per_hour"] for m, r in results.items() if "steps_per_hour" in r}
    ratios = [
        (a, b)
        for a, b in (
            ("async", "sync"),
            ("async", "trl"),
            ("colocated", "trl"),
            ("sync", "trl"),
            ("colocated", "sync"),
        )
        if a in rate and b in rate
    ]
    if ratios:
        print(
            "ratios of RL steps per hour: "
            + ", ".join(f"{a}/{b} {rate[a] / rate[b]:.2f}x" for a, b in ratios)
            + " (goals: async >= 2x TRL, async GPU busy >= 85%)"
        )


def fit(args: argparse.Namespace) -> None:
    """The memory estimate for each Qwen3 shape and mode at 16K tokens per step on an
    H200 (139 GiB), at the best `gpu_memory_utilization` for each."""
    from rlcoach.runtime.memory import GiB, ModelShape, plan_memory

    gpu = args.gpu_gib * GiB
    print(f"memory plan at {args.tokens} tokens per pass, one {args.gpu_gib} GiB GPU, LoRA r16")
    print(f"{'shape':6} {'checkpointing':>13}  {'split':>30}  {'sleep':>30}")
    for name, sizes in SHAPES.items():
        if name == "tiny":
            continue
        shape = ModelShape.from_config({**sizes, "tie_word_embeddings": name in TIED})
        for checkpointing in (False, True):
            cells = []
            for colocation in ("split", "sleep"):
                best = None
                for util in [u / 100 for u in range(95, 4, -5)]:
                    plan = plan_memory(
                        shape,
                        gpu_bytes=gpu,
                        colocation=colocation,
                        gpu_memory_utilization=util,
                        max_model_len=args.tokens,
                        max_loras=2,
                        max_lora_rank=16,
                        lora_rank=16,
                        micro_batch_tokens=args.tokens,
                        logprob_chunk_tokens=1024,
                        activation_checkpointing=checkpointing,
                        compiled_layers=True,
                    )
                    if plan.fits:
                        best = plan
                        cells.append(
                            f"util {util:.2f}: KV {plan.kv_cache_tokens // 1000}K tok, "
                            f"peak {plan.trainer_peak_bytes / GiB:.0f}G"
                        )
                        break
                if best is None:
                    cells.append("does not fit")
            print(f"{name:6} {checkpointing!s:>13}  {cells[0]:>30}  {cells[1]:>30}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", nargs="?", default="run", choices=["run", "one", "fit"])
    parser.add_argument("--model", help="a model folder (else --shape is written to /tmp)")
    parser.add_argument("--shape", default="4b", choices=sorted(SHAPES))
    parser.add_argument("--tokenizer", help="tokenizer folder for --shape (e.g. .gpu/tok)")
    parser.add_argument("--tiny", action="store_true", help="CPU rehearsal: tiny everything")
    parser.add_argument("--modes", default="sync,async,colocated,trl")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per mode")
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--completion-tokens", type=int, default=384)
    parser.add_argument("--micro-batch-seqs", type=int, default=16)
    parser.add_argument("--split-util", type=float, default=0.4)
    parser.add_argument("--sleep-util", type=float, default=0.8)
    parser.add_argument("--engine", choices=["vllm", "transformers"], default=None)
    parser.add_argument(
        "--vllm", choices=sorted(VLLM_LABELS), default="graphs", help="vLLM's compilation"
    )
    parser.add_argument(
        "--budget-s", type=float, default=560.0, help="for all children (a GPU command: 600)"
    )
    parser.add_argument("--out", help="folder for the JSON results and the children's logs")
    parser.add_argument(
        "--profile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after the sync and async modes, one more sync step profiled (profile_step.py)",
    )
    parser.add_argument("--gpu-gib", type=float, default=139.0, help="fit: GPU memory")
    parser.add_argument("--tokens", type=int, default=16384, help="fit: tokens per pass")
    args = parser.parse_args()
    if args.command == "fit":
        fit(args)
        return
    if args.tiny and args.command == "run":
        args.groups, args.group_size = 2, 4
        args.prompt_tokens, args.completion_tokens, args.micro_batch_seqs = 16, 8, 4
        args.steps = min(args.steps, 2)
        args.shape = "tiny"
    args.engine = args.engine or ("transformers" if args.tiny else "vllm")
    args.modes = args.modes.split(",")
    if args.command == "one":  # prints a MODE line per mode
        if args.modes == ["trl"]:
            run_trl(args)
        else:
            asyncio.run(run_ours(args))
        return
    if args.model is None:
        from rlcoach.models.bundled import bundled_model_path

        tokenizer = args.tokenizer or bundled_model_path()
        args.model = str(Path(tempfile.gettempdir()) / f"rlcoach-step-{args.shape}")
        stats = make_model(args.model, args.shape, tokenizer)
        print(f"model: Qwen3 {args.shape} shape, random weights, {stats}", flush=True)
    args.shape_label = args.model
    args.child_args = (
        [
            f"--{name.replace('_', '-')}={getattr(args, name)}"
            for name in (
                "model",
                "engine",
                "steps",
                "groups",
                "group_size",
                "prompt_tokens",
                "completion_tokens",
                "micro_batch_seqs",
                "split_util",
                "sleep_util",
                "vllm",
            )
        ]
        + (["--tiny"] if args.tiny else [])
        + ([] if args.profile else ["--no-profile"])
    )
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    groups = [[m for m in ("sync", "async") if m in args.modes]]
    # TRL before colocated: the comparison the goals name comes first if time runs short.
    groups += [[m] for m in ("trl", "colocated") if m in args.modes]
    deadline = time.perf_counter() + args.budget_s
    groups = [g for g in groups if g]
    for index, modes in enumerate(groups):
        if modes == ["trl"]:
            try:
                import trl  # noqa: F401
            except ImportError:
                results["trl"] = {"refused": "TRL is not installed here"}
                continue
        # Each child may use what is left, less a minute for each child still to come.
        left = deadline - time.perf_counter() - 60 * (len(groups) - index - 1)
        results.update(_child(args, modes, max(left, 60.0)))
        if args.out:
            (Path(args.out) / "step.json").write_text(json.dumps(results, indent=1))
    report(results, args)


if __name__ == "__main__":
    main()
