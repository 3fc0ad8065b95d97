"""Benchmarks of the core loop, each printed as a ratio against a peer or limit measured
in the same run (run: `make bench`, or `.venv/bin/python bench/core_loop.py`).

1. Gateway overhead: requests/s and generated tokens/s through the policy endpoint
   against the same requests sent to the vLLM server directly (same body, same
   concurrency, `ignore_eos` so both generate the same number of tokens). Rounds
   alternate direct/gateway so drift hits both.
2. Publish latency: from the end of the optimizer step to the first token sampled by
   the new adapter (save + load into vLLM + one request), against the step itself.
3. Trainer throughput: tokens/s of the LoRA step (forward + backward + optimizer)
   against a plain forward pass over the same rows (the limit it can approach).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

import httpx
import torch

from rlcoach import LocalBackend, TrainableModel, gather_trajectory_groups
from rlcoach.demo.task import Question, run_question
from rlcoach.trainer.sequences import build_sequences, pack_sequences

BODY = {
    "messages": [{"role": "user", "content": "Tell me a story about a robot."}],
    "max_tokens": 32,
    "temperature": 1.0,
    "ignore_eos": True,
}


async def _load(
    url: str, model: str, requests: int, concurrency: int, force: bool, key: str = ""
) -> float:
    body = {**BODY, "model": model}
    if force:  # what the gateway adds, so the direct run does the same work
        body.update(logprobs=True, return_token_ids=True)
    semaphore = asyncio.Semaphore(concurrency)
    # The engine listens on a Unix socket and wants its key (engines/process.py).
    options: dict = {"headers": {"Authorization": f"Bearer {key}"}} if key else {}
    if url.startswith("unix:"):
        options["transport"] = httpx.AsyncHTTPTransport(uds=url.removeprefix("unix:"))
        url = "http://engine"
    async with httpx.AsyncClient(base_url=url, timeout=600, **options) as http:

        async def one() -> None:
            async with semaphore:
                response = await http.post("/v1/chat/completions", json=body)
                response.raise_for_status()

        started = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(requests)))
        return time.perf_counter() - started


async def bench_gateway(
    backend: LocalBackend, model: TrainableModel, requests: int, concurrency: int, rounds: int
) -> None:
    engine = backend.engine
    key = engine._key
    await _load(engine.url, engine.base_name, concurrency, concurrency, True, key)  # warm-up
    direct, gateway = [], []
    for _ in range(rounds):
        direct.append(await _load(engine.url, engine.base_name, requests, concurrency, True, key))
        gateway.append(await _load(backend.url, model.served_name, requests, concurrency, False))
    tokens = requests * BODY["max_tokens"]
    d, g = statistics.median(direct), statistics.median(gateway)
    print(
        f"gateway: {requests} requests x {BODY['max_tokens']} tokens, concurrency "
        f"{concurrency}, median of {rounds} rounds"
    )
    print(f"  vLLM direct   {requests / d:7.2f} req/s  {tokens / d:8.1f} tok/s")
    print(f"  via gateway   {requests / g:7.2f} req/s  {tokens / g:8.1f} tok/s")
    print(f"  ratio gateway/direct throughput: {d / g:.3f}")


async def bench_publish_and_trainer(backend: LocalBackend, model: TrainableModel) -> None:
    client = model.openai_client()

    async def attempt(question: Question):
        trajectory = await run_question(model, client, question)
        trajectory.reward += 0.01 * trajectory.sampled_token_count()  # variance in every group
        return trajectory

    questions = [Question(123, 456), Question(700, 211)]
    groups = await gather_trajectory_groups(
        [[attempt(q) for _ in range(8)] for q in questions], progress=False
    )
    result = await model.train(groups)
    first_token_started = time.perf_counter()
    # One token: the gateway streams from a finished completion, so max_tokens=1 is the
    # honest "first token" here.
    await client.chat.completions.create(
        model=model.served_name, messages=BODY["messages"], max_tokens=1
    )
    first_token = time.perf_counter() - first_token_started
    latency = result.save_seconds + result.publish_seconds + first_token
    s = result.stats
    print(
        f"publish: optimizer step {s.seconds:.2f} s; then save {result.save_seconds * 1000:.0f}"
        f" ms + load into vLLM {result.publish_seconds * 1000:.0f} ms + first token "
        f"{first_token * 1000:.0f} ms = {latency * 1000:.0f} ms"
    )
    print(f"  ratio publish latency/step time: {latency / s.seconds:.4f}")

    trainer = backend._trainers[model.name]
    sequences = [seq for g in groups for t in g.trajectories for seq in build_sequences(t, 1.0)]
    rows = pack_sequences(sequences, model.config.micro_batch_tokens)
    started = time.perf_counter()
    with torch.no_grad():
        for row in rows:
            trainer.row_logprobs(row)
    forward = time.perf_counter() - started
    tokens = sum(len(seq.token_ids) for seq in sequences)
    print(
        f"trainer: {tokens} tokens in {len(rows)} rows; LoRA step {s.seconds:.2f} s = "
        f"{s.total_tokens / s.seconds:.0f} tok/s; forward only {forward:.2f} s = "
        f"{tokens / forward:.0f} tok/s"
    )
    ratio = (s.total_tokens / s.seconds) / (tokens / forward)
    print(f"  ratio step/forward-only throughput: {ratio:.3f}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        async with LocalBackend(root, engine={"kind": "vllm"}) as backend:
            model = TrainableModel("bench", "bench", config={"learning_rate": 1e-3})
            await model.register(backend)
            await bench_gateway(backend, model, args.requests, args.concurrency, args.rounds)
            await bench_publish_and_trainer(backend, model)


if __name__ == "__main__":
    asyncio.run(main())
