"""The policy endpoint's own cost per response, on the CPU, against a fast stand-in engine.

Three processes, so that none of them steals the others' interpreter lock:

- the upstream: bench/standin_vllm.py, an OpenAI-compatible server speaking vLLM's HTTP
  that answers `--tokens`-token completions with logprobs and token ids from a
  precomputed body (a 512-token answer is ~52 KB of JSON);
- the endpoint: this process, a `LocalBackend` whose vLLM engine client (`VLLMEngine`)
  started the stand-in instead of vLLM; the gateway serves on its own thread, as always,
  and a task here takes the recorded exchanges every 0.2 s, as finished rollouts do;
- the load: a child of this script (`loadgen`) with `--concurrency` keep-alive
  connections, each sending the next request as soon as its last one was answered, with
  the rollout header (so every response is recorded, as in training).

Two loads, each measured direct to the upstream and through the endpoint, alternating,
`--rounds` times (medians reported):

- paced: the upstream holds each answer `--hold-s` seconds (+-50%, so answers do not
  arrive in waves), standing in for generation. 256 connections and 1 s is ~256
  answers/s, about nine times what vLLM generates on an H200 at 512 tokens (~28/s), so
  the added latency measured here is an upper bound for a GPU. Reported: p50 and p99
  latency, and their excess over direct (the goal: p50 <= 1 ms, p99 <= 5 ms added);
- saturated: the upstream answers at once; answers/s through the endpoint against
  direct, and the endpoint process's CPU time per answer (its whole cost: parse,
  route, forward, record, send).

  python bench/gateway_overhead.py [--concurrency 256 --tokens 512 --seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
STANDIN = HERE / "standin_vllm.py"
KEY_VARIABLE = "RLCOACH_BENCH_ENGINE_KEY"
"""The load generator sends this key as a Bearer token (set it to the engine's key for
calls straight to an engine that rlcoach started: those need its key)."""


def engine_key_env(engine: object) -> dict[str, str]:
    """The environment for a load generator that calls `engine` directly."""
    return {**os.environ, KEY_VARIABLE: getattr(engine, "_key", "")}


# -- the load generator (its own process) ------------------------------------------------


async def _connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to `url`: `http://host:port`, or `unix:/path` (an engine's socket)."""
    if url.startswith("unix:"):
        return await asyncio.open_unix_connection(url.removeprefix("unix:"))
    host, _, port = url.removeprefix("http://").partition(":")
    return await asyncio.open_connection(host, int(port))


async def _worker(
    url: str,
    request: bytes,
    start: float,
    stop: float,
    latencies: list[float],
    left: list[int] | None = None,
) -> None:
    """Send `request` on one keep-alive connection until `stop`, or, with `left` (a
    shared count), until the count is used up."""
    reader, writer = await _connect(url)
    try:
        while left[0] > 0 if left is not None else time.perf_counter() < stop:
            if left is not None:
                left[0] -= 1
            sent = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            body = await reader.readexactly(length)
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"{head.splitlines()[0]!r}: {body[:300]!r}")
            if sent >= start:
                latencies.append(time.perf_counter() - sent)
    finally:
        writer.close()


def _prompt(words: int) -> str:
    if not words:
        return "Tell me a story about a robot. " * 8
    vocabulary = [
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
    ]
    return " ".join(vocabulary[(7 * i) % len(vocabulary)] for i in range(words))


async def _load(args: argparse.Namespace) -> dict[str, float]:
    host = "engine" if args.url.startswith("unix:") else args.url.removeprefix("http://")
    body = {
        "model": args.model,
        "messages": [{"role": "user", "content": _prompt(args.prompt_words)}],
        "max_tokens": args.tokens,
        "temperature": 1.0,
        "logprobs": True,  # what the endpoint adds, so direct calls do the same work
        "return_token_ids": True,
    }
    if args.hold_s:
        body["standin_hold_s"] = args.hold_s
    if args.ignore_eos:
        body["ignore_eos"] = True
    payload = json.dumps(body).encode()
    header = f"X-RLCoach-Rollout: bench-{os.getpid()}\r\n" if args.record else ""
    if key := os.environ.get(KEY_VARIABLE):  # a direct call to an engine started by rlcoach
        header += f"Authorization: Bearer {key}\r\n"
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n{header}\r\n"
    ).encode() + payload
    latencies: list[float] = []
    now = time.perf_counter()
    left = [args.count] if args.count else None
    start = now if left else now + args.warmup_s
    stop = start + args.seconds
    await asyncio.gather(
        *(_worker(args.url, request, start, stop, latencies, left) for _ in range(args.concurrency))
    )
    seconds = time.perf_counter() - now if left else args.seconds
    latencies.sort()
    pick = lambda q: latencies[min(int(q * len(latencies)), len(latencies) - 1)]  # noqa: E731
    return {
        "answers": len(latencies),
        "seconds": seconds,
        "answers_per_s": len(latencies) / seconds,
        "p50_ms": 1000 * pick(0.50),
        "p90_ms": 1000 * pick(0.90),
        "p99_ms": 1000 * pick(0.99),
    }


def loadgen(args: argparse.Namespace) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    print("RESULT " + json.dumps(asyncio.run(_load(args))), flush=True)


# -- the endpoint (this process) ---------------------------------------------------------


def _standin_backend(root: Path, tokens: int):
    from rlcoach import LocalBackend
    from rlcoach.engines.vllm import VLLMEngine

    class StandInVLLM(VLLMEngine):
        def command(self, socket_path: Path) -> list[str]:
            args = super().command(socket_path)[3:]  # drop `-m vllm.entrypoints...`
            return [sys.executable, str(STANDIN), *args, "--completion-tokens", str(tokens)]

    class StandInBackend(LocalBackend):
        def _make_engine(self, model_path, base_name):
            return StandInVLLM(model_path, base_name, self.engine_config, root / "standin.log")

    return StandInBackend(root, engine={"kind": "vllm", "startup_timeout_s": 60})


def _profile(seconds: float, out: Path) -> subprocess.Popen[bytes] | None:
    """py-spy on this process (the endpoint) for `seconds`, collapsed stacks to `out`."""
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():
        print("(py-spy is not installed in this environment: no profile)", flush=True)
        return None
    command = [str(spy), "record", "-p", str(os.getpid()), "-d", str(int(seconds))]
    command += ["-r", "200", "-f", "raw", "-o", str(out), "--nonblocking"]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def print_profile(raw: Path, top: int = 18) -> None:
    """Where the endpoint's samples went: the frames most often on top of a stack (self)
    and, for rlcoach, starlette, uvicorn, httpx and json frames, anywhere on it (total)."""
    own: dict[str, int] = {}
    total: dict[str, int] = {}
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        samples += int(count)
        own[frames[-1]] = own.get(frames[-1], 0) + int(count)
        for frame in set(frames):
            total[frame] = total.get(frame, 0) + int(count)
    print(f"\nprofile of the endpoint process, {samples} samples (py-spy, 200/s)")
    print("self:")
    for frame, count in sorted(own.items(), key=lambda x: -x[1])[:top]:
        print(f"  {100 * count / samples:5.1f}%  {frame[:140]}")
    print("total (selected):")
    keys = (
        *("gateway.py", "recorder.py", "rescore.py", "router.py", "vllm.py", "recording"),
        *("json", "httpx", "httpcore"),
    )
    chosen = [(f, c) for f, c in total.items() if any(k in f for k in keys)]
    for frame, count in sorted(chosen, key=lambda x: -x[1])[:top]:
        print(f"  {100 * count / samples:5.1f}%  {frame[:140]}")


def _run_load(
    url: str,
    model: str,
    hold_s: float,
    record: bool,
    args: argparse.Namespace,
    env: dict[str, str] | None = None,
):
    command = [
        sys.executable,
        __file__,
        "loadgen",
        "--url",
        url,
        "--model",
        model,
        "--concurrency",
        str(args.concurrency),
        "--tokens",
        str(args.tokens),
        "--seconds",
        str(args.seconds),
        "--hold-s",
        str(hold_s),
    ] + (["--record"] if record else [])
    cpu = os.times()
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=args.seconds + 120, env=env
    )
    used = os.times()
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"the load generator failed:\n{done.stderr[-2000:]}")
    result = json.loads(lines[-1][7:])
    seconds = (used.user - cpu.user) + (used.system - cpu.system)
    result["endpoint_cpu_ms_per_answer"] = 1000 * seconds / max(result["answers"], 1)
    return result


async def bench(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    from rlcoach import TrainableModel

    root = Path(tempfile.mkdtemp(prefix="rlcoach-gw-"))
    folder = root / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 49152}))
    async with _standin_backend(root, args.tokens) as backend:
        model = TrainableModel("bench", "gateway", base_model=str(folder))
        await model.register(backend)
        recorder = backend.gateway.recorder

        async def drain() -> None:  # finished rollouts take their exchanges
            while True:
                await asyncio.sleep(0.2)
                for rollout_id in list(recorder._exchanges):
                    recorder.take(rollout_id)

        drainer = asyncio.create_task(drain())
        client = getattr(getattr(backend.engine, "_client", None), "backend", "httpx")
        print(f"endpoint -> engine HTTP client: {client}", flush=True)
        direct, endpoint = backend.engine.url, backend.url
        served = {"direct": backend.engine.base_name, "endpoint": model.served_name}
        runs: dict[str, list[dict[str, float]]] = {}
        try:
            for load, hold in (("paced", args.hold_s), ("saturated", 0.0)):
                for round_index in range(args.rounds):
                    for path, url in (("direct", direct), ("endpoint", endpoint)):
                        spy = None
                        if args.profile and (load, path, round_index) == (
                            "saturated",
                            "endpoint",
                            0,
                        ):
                            spy = _profile(args.seconds, root / "profile.txt")
                        result = await asyncio.to_thread(
                            _run_load,
                            url,
                            served[path],
                            hold,
                            path == "endpoint",
                            args,
                            engine_key_env(backend.engine) if path == "direct" else None,
                        )
                        if spy is not None:
                            await asyncio.to_thread(spy.wait)
                            print_profile(root / "profile.txt")
                        runs.setdefault(f"{load} {path}", []).append(result)
                        print(
                            f"round {round_index} {load:9} {path:8} "
                            + json.dumps({k: round(v, 3) for k, v in result.items()}),
                            flush=True,
                        )
        finally:
            drainer.cancel()
    return {
        name: {key: statistics.median(r[key] for r in results) for key in results[0]}
        for name, results in runs.items()
    }


def report(medians: dict[str, dict[str, float]], args: argparse.Namespace) -> None:
    print(
        f"\npolicy endpoint overhead: {args.concurrency} concurrent {args.tokens}-token answers "
        f"with logprobs, median of {args.rounds} rounds of {args.seconds} s"
    )
    print(
        f"{'load':24} {'answers/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'endpoint CPU ms/answer':>24}"
    )
    for name, m in medians.items():
        cpu = f"{m['endpoint_cpu_ms_per_answer']:.2f}" if "endpoint" in name else "-"
        print(
            f"{name:24} {m['answers_per_s']:10.0f} {m['p50_ms']:8.2f} {m['p99_ms']:8.2f} {cpu:>24}"
        )
    paced_d, paced_e = medians["paced direct"], medians["paced endpoint"]
    added50 = paced_e["p50_ms"] - paced_d["p50_ms"]
    added99 = paced_e["p99_ms"] - paced_d["p99_ms"]
    sat = (
        medians["saturated endpoint"]["answers_per_s"]
        / medians["saturated direct"]["answers_per_s"]
    )
    print(
        f"added by the endpoint (paced, hold {args.hold_s} s): p50 {added50:+.2f} ms (goal <= 1), "
        f"p99 {added99:+.2f} ms (goal <= 5); saturated throughput {sat:.3f} of direct; "
        f"endpoint CPU {medians['saturated endpoint']['endpoint_cpu_ms_per_answer']:.2f} ms "
        "per answer"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command")
    g = sub.add_parser("loadgen")
    g.add_argument("--url", required=True)
    g.add_argument("--model", required=True)
    g.add_argument("--record", action="store_true")
    g.add_argument("--count", type=int, default=0, help="send this many, then stop (0: --seconds)")
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("--prompt-words", type=int, default=0)
    for p in (parser, g):
        p.add_argument("--concurrency", type=int, default=256)
        p.add_argument("--tokens", type=int, default=512)
        p.add_argument("--seconds", type=float, default=10.0)
        p.add_argument("--hold-s", type=float, default=1.0)
        p.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="py-spy the first saturated run")
    parser.add_argument("--json", help="also write the medians to this file")
    args = parser.parse_args()
    if args.command == "loadgen":
        loadgen(args)
        return
    medians = asyncio.run(bench(args))
    report(medians, args)
    if args.json:
        Path(args.json).write_text(json.dumps(medians, indent=1))


if __name__ == "__main__":
    main()
