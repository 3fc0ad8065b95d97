"""Rollout throughput and adapter publish latency through our backend, on a GPU.

One `LocalBackend` (vLLM OpenAI server subprocess + our gateway + the LoRA trainer, all
on one GPU) serves a model folder (bench/gpu/shapes.py writes random-weight ones).

1. Publish latency: `model.train(groups)` on a small synthetic batch; measured from the
   end of the optimizer step (the trainer's `step` returning) to the first token of a
   request for the model's latest name through the gateway, sent the moment the router
   switches to the new step. Reported with its parts: writing the adapter, vLLM's
   `load_lora_adapter`, the first-token request. The first publish (warm-up) is excluded.
2. Rollout throughput: `--requests` concurrent chat completions of `--max-tokens` tokens
   (`ignore_eos`) each, sent to the vLLM server directly and through the gateway, with
   the base weights and with the trained LoRA; the direct requests ask for the same
   logprobs and token ids the gateway adds, and the gateway's carry the rollout header
   (recorded, as in training). The load comes from a process of its own
   (bench/gateway_overhead.py's load generator), not from this one, where it would
   compete with the gateway's thread. Modes alternate in each round and the median of
   `--rounds` rounds is printed, with the gateway/direct ratio.

  python bench/gpu/serving.py --model /tmp/m4b --requests 256 --max-tokens 512
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import httpx

from rlcoach import LocalBackend, TrainableModel
from rlcoach.trajectory.trajectories import SampledChoice, Trajectory, TrajectoryGroup

LOADGEN = Path(__file__).resolve().parents[1] / "gateway_overhead.py"


def _groups(
    prompt_tokens: int, sampled: int, vocab: int, seed: int, policy: str
) -> list[TrajectoryGroup]:
    """A batch as `policy` (the model's current `name@step`) would have sampled it: older
    versions would be dropped as stale (TrainConfig.max_staleness)."""
    rng = random.Random(seed)
    trajectories = []
    for reward in (0.0, 1.0):
        choice = SampledChoice(
            message={"role": "assistant", "content": ""},
            policy=policy,
            prompt_token_ids=[rng.randrange(100, vocab) for _ in range(prompt_tokens)],
            token_ids=[rng.randrange(100, vocab) for _ in range(sampled)],
            logprobs=[-10.0] * sampled,
        )
        trajectories.append(Trajectory(choices=[choice], reward=reward))
    return [TrajectoryGroup(trajectories=trajectories)]


def _load(
    url: str, model: str, args: argparse.Namespace, record: bool, env: dict[str, str] | None = None
) -> tuple[float, int]:
    """`--requests` concurrent chat completions of `--max-tokens` tokens (`ignore_eos`),
    sent by the load generator of bench/gateway_overhead.py in a process of its own (in
    this process it would compete with the gateway's thread for the interpreter lock);
    every body asks for the logprobs and token ids the gateway adds. Returns (seconds,
    completion tokens)."""
    command = [
        sys.executable,
        str(LOADGEN),
        "loadgen",
        "--url",
        url,
        "--model",
        model,
        "--concurrency",
        str(args.requests),
        "--count",
        str(args.requests),
        "--tokens",
        str(args.max_tokens),
        "--hold-s",
        "0",
        "--ignore-eos",
        "--prompt-words",
        str(args.prompt_words),
    ] + (["--record"] if record else [])
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, env=env)
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"the load generator failed:\n{done.stderr[-2000:]}")
    result = json.loads(lines[-1][len("RESULT ") :])
    return result["seconds"], int(result["answers"]) * args.max_tokens


async def _publish_once(
    backend: LocalBackend,
    model: TrainableModel,
    http: httpx.AsyncClient,
    groups: list[TrajectoryGroup],
) -> dict[str, float]:
    trainer = backend._trainer(model)
    marks: dict[str, float] = {}
    original = trainer.step

    def timed_step(*a, **k):
        stats = original(*a, **k)
        marks["step_end"] = time.perf_counter()
        return stats

    trainer.step = timed_step
    router = backend.gateway.router
    target = model.step + 1

    async def first_token() -> None:
        while router.latest.get(model.name) != target:  # noqa: ASYNC110 (other thread's loop)
            await asyncio.sleep(0.0005)
        marks["switched"] = time.perf_counter()
        body = {
            "model": model.name,
            "max_tokens": 1,
            "temperature": 1.0,
            "messages": [{"role": "user", "content": "hello"}],
        }
        response = await http.post(backend.url + "/v1/chat/completions", json=body)
        response.raise_for_status()
        assert response.json()["model"] == f"{model.name}@{target}", response.json()["model"]
        marks["first_token"] = time.perf_counter()

    waiter = asyncio.create_task(first_token())
    try:
        result = await model.train(groups)
        await waiter
    finally:
        trainer.step = original
    return {
        "latency_s": marks["first_token"] - marks["step_end"],
        "save_adapter_s": result.save_seconds,
        "vllm_load_s": result.publish_seconds,
        "first_token_s": marks["first_token"] - marks["switched"],
        "train_step_s": result.stats.seconds,
    }


async def main(args: argparse.Namespace) -> None:
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    root = Path(tempfile.mkdtemp(prefix="rlcoach-bench-"))
    engine = {
        "kind": "vllm",
        "max_model_len": args.max_model_len,
        "max_loras": 2,
        "max_lora_rank": 16,
        "gpu_memory_utilization": args.gpu_util,
        "startup_timeout_s": 1200.0,
        "extra_args": args.vllm_arg,
    }
    config = {"learning_rate": 1e-5, "micro_batch_tokens": 4096, "lora": {"rank": 16, "alpha": 32}}
    started = time.perf_counter()
    async with LocalBackend(root, engine=engine) as backend:
        model = TrainableModel("bench", "gpu", base_model=args.model, config=config)
        await model.register(backend)
        startup = time.perf_counter() - started
        print(f"backend up (vLLM server + gateway) in {startup:.0f} s", flush=True)
        limits = httpx.Limits(max_connections=2048, max_keepalive_connections=1024)
        async with httpx.AsyncClient(timeout=1800, limits=limits) as http:
            publishes = []
            for index in range(args.publishes + 1):
                groups = _groups(
                    args.train_prompt, args.train_sampled, vocab, index, model.served_name
                )
                try:
                    publishes.append(await _publish_once(backend, model, http, groups))
                except Exception:  # the throughput part still runs
                    traceback.print_exc()
                    break
                print(
                    f"publish {index}{' (warm-up)' if index == 0 else ''}: "
                    + json.dumps({k: round(v, 4) for k, v in publishes[-1].items()}),
                    flush=True,
                )
            engine_url = backend.engine.url
            adapter = f"{model.name}@{model.step}"
            modes = [
                ("vLLM direct, base", engine_url, backend.engine.base_name, True),
                ("gateway, base", backend.url, f"{model.name}@0", False),
            ]
            if model.step > 0:
                modes += [
                    ("vLLM direct, LoRA", engine_url, adapter, True),
                    ("gateway, LoRA", backend.url, model.name, False),
                ]
            warm = argparse.Namespace(**{**vars(args), "requests": 8})
            key = {**os.environ, "RLCOACH_BENCH_ENGINE_KEY": backend.engine._key}  # direct calls
            await asyncio.to_thread(_load, engine_url, backend.engine.base_name, warm, False, key)
            runs: dict[str, list[float]] = {name: [] for name, *_ in modes}
            cpus: dict[str, list[float]] = {}
            for round_index in range(args.rounds):
                for name, url, served, direct in modes:
                    before = os.times()
                    try:
                        seconds, tokens = await asyncio.to_thread(
                            _load, url, served, args, not direct, key if direct else None
                        )
                    except Exception:
                        traceback.print_exc()
                        continue
                    after = os.times()
                    # This process holds the gateway (its thread) and the engine client, not
                    # the load (a child) nor vLLM (a subprocess): its CPU is the endpoint's.
                    cpu = (after.user - before.user) + (after.system - before.system)
                    runs[name].append(tokens / seconds)
                    cpus.setdefault(name, []).append(cpu / seconds)
                    print(
                        f"round {round_index} {name}: {tokens} tokens in {seconds:.2f} s; "
                        f"this process's CPU {cpu:.2f} s ({cpu / seconds:.0%} of one core)",
                        flush=True,
                    )
    timed = publishes[1:]
    print(
        f"\nrollouts: {args.requests} concurrent chat requests x {args.max_tokens} tokens "
        f"(~{args.prompt_words} prompt words), median of {args.rounds} rounds"
    )
    median = {name: statistics.median(v) for name, v in runs.items() if v}
    for name, value in median.items():
        kind = "base" if "base" in name else "LoRA"
        peer = median.get(f"vLLM direct, {kind}")
        ratio = f"{value / peer:.3f} of vLLM direct, {kind}" if peer else ""
        cpu = statistics.median(cpus[name]) if cpus.get(name) else None
        busy = f"   endpoint process CPU {cpu:.0%} of one core" if cpu is not None else ""
        print(f"  {name:20} {value:9.0f} tok/s   {ratio}{busy}")
    if "vLLM direct, LoRA" in median and "vLLM direct, base" in median:
        lora_cost = median["vLLM direct, LoRA"] / median["vLLM direct, base"]
        print(f"  LoRA / base (direct): {lora_cost:.3f}")
    if timed:
        parts = {k: statistics.median(p[k] for p in timed) for k in timed[0]}
        print(
            f"publish, end of optimizer step -> first token of the new adapter through the "
            f"gateway, median of {len(timed)}: {parts['latency_s']:.3f} s "
            f"(write adapter {parts['save_adapter_s']:.3f} s, vLLM load "
            f"{parts['vllm_load_s']:.3f} s, first-token request {parts['first_token_s']:.3f} s;"
            f" goal 0.3 s: {0.3 / parts['latency_s']:.2f}x)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--prompt-words", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--publishes", type=int, default=3)
    parser.add_argument("--train-prompt", type=int, default=256)
    parser.add_argument("--train-sampled", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--gpu-util", type=float, default=0.5)
    parser.add_argument(
        "--vllm-arg", action="append", default=[], help="extra `vllm serve` argument (repeat)"
    )
    asyncio.run(main(parser.parse_args()))
