"""Time to first token of a streamed chat: through the policy endpoint against vLLM direct.

    flock /tmp/rlcoach-cpu.lock .venv/bin/python bench/stream_ttft.py --requests 40

Starts the real vLLM engine behind the policy endpoint (one `LocalBackend`), then sends
the same streamed chat request, one at a time, alternating between (a) vLLM's own
server on its private Unix socket, with the engine's key (as the endpoint reaches it) and
(b) the policy endpoint on 127.0.0.1 inside a rollout scope — which
adds the gateway's routing, the forced logprobs and token ids (asked for on both), the
relay of each event and the recording of the whole completion when the stream ends.
Time to first token is the time from sending the request to the first event that
carries a sampled token id. Prints the median and p90 of each, and the endpoint's
difference and ratio to direct (the goal: within 20 ms).
"""

import argparse
import asyncio
import json
import statistics
import tempfile
import time

import httpx

from rlcoach import LocalBackend, TrainableModel
from rlcoach.endpoint.gateway import ROLLOUT_HEADER

MESSAGES = [{"role": "user", "content": "Name three kitchen appliances."}]


async def first_token_s(http: httpx.AsyncClient, url: str, body: dict, headers: dict) -> float:
    started = time.perf_counter()
    first = None
    async with http.stream("POST", url, json=body, headers=headers) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if first is None and line.startswith("data:") and "[DONE]" not in line:
                chunk = json.loads(line[5:])
                if any(c.get("token_ids") for c in chunk.get("choices") or []):
                    first = time.perf_counter() - started
    assert first is not None, "no event carried a token"
    return first


def summary(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[int(0.9 * (len(ordered) - 1))]


async def main(args: argparse.Namespace) -> None:
    async with LocalBackend(tempfile.mkdtemp(prefix="ttft-"), engine={"kind": "vllm"}) as backend:
        policy = TrainableModel("ttft", "bench")
        await policy.register(backend)
        engine = backend.engine
        body = {
            "messages": MESSAGES,
            "max_tokens": args.max_tokens,
            "temperature": 1.0,
            "stream": True,
            "logprobs": True,
            "return_token_ids": True,
        }
        direct = {**body, "model": engine.base_name}
        through = {**body, "model": f"{policy.name}@0"}
        times: dict[str, list[float]] = {"vLLM direct": [], "policy endpoint": []}
        # vLLM listens on a private Unix socket with a key (core/engines/process.py).
        vllm = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(engine.socket_path)),
            base_url="http://engine",
            headers={"Authorization": f"Bearer {engine._key}"},
            timeout=120,
        )
        async with vllm, httpx.AsyncClient(timeout=120) as http:
            for index in range(args.warmup + args.requests):
                pair = [
                    ("vLLM direct", vllm, "/v1/chat/completions", direct, {}),
                    (
                        "policy endpoint",
                        http,
                        f"{backend.url}/v1/chat/completions",
                        through,
                        {ROLLOUT_HEADER: f"bench-{index}"},
                    ),
                ]
                for name, client, url, request, headers in pair if index % 2 else pair[::-1]:
                    seconds = await first_token_s(client, url, request, headers)
                    if index >= args.warmup:
                        times[name].append(seconds)
                backend.gateway.recorder.take(f"bench-{index}")
        (d50, d90), (e50, e90) = summary(times["vLLM direct"]), summary(times["policy endpoint"])
        print(f"{args.requests} streamed requests each, max_tokens {args.max_tokens}, one at once")
        print(f"vLLM direct      TTFT median {d50 * 1000:7.1f} ms  p90 {d90 * 1000:7.1f} ms")
        print(f"policy endpoint  TTFT median {e50 * 1000:7.1f} ms  p90 {e90 * 1000:7.1f} ms")
        print(
            f"endpoint - direct: median {(e50 - d50) * 1000:+.1f} ms, p90 "
            f"{(e90 - d90) * 1000:+.1f} ms; ratio {e50 / d50:.3f} (goal: within 20 ms)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    asyncio.run(main(parser.parse_args()))
