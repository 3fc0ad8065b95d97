"""Forced tool calls: how many of 100 come back as a call whose arguments fit the schema.

    flock /tmp/rlcoach-heavy.lock timeout 600 \
        .venv/bin/python bench/forced_calls.py --model smollm2-135m-instruct
    flock /tmp/rlcoach-heavy.lock timeout 600 \
        .venv/bin/python bench/forced_calls.py --model gemma3-270m

Starts the real vLLM engine behind the policy endpoint (a `LocalBackend`) and sends the
same 100 requests twice: through the endpoint (the OpenAI client, as user code does) and
to the vLLM server directly (the same bodies on the engine's own socket, base model, no
endpoint in between). The requests cycle over the five tools of bench/tool_schemas.py
(integers; strings, enums, nested objects, an array, optional fields), half with
`tool_choice="required"` (all five tools offered), half naming the tool
(`tool_choice={"type": "function", ...}`), and every fourth with the tools marked
`strict`. A call is valid when the reply has at least one tool call (`required`) or a
call of the named tool, and every call's arguments parse as JSON and validate against
the tool's schema (jsonschema). Sampling is at temperature 1.0, as in training, with
`--max-tokens` (default 160).

Prints one line per path: valid / 100, then a count of each kind of failure.
"""

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import jsonschema
from tool_schemas import QUESTIONS, TOOLS, tool

from rlcoach import LocalBackend
from rlcoach.endpoint.call_grammar import forced_call


def requests(count: int, max_tokens: int) -> list[dict[str, Any]]:
    """`count` chat bodies (no `model`): each tool in turn, required or named, some strict."""
    bodies = []
    names = [t["name"] for t in TOOLS]
    for index in range(count):
        name = names[index % len(names)]
        question = QUESTIONS[name][(index // len(names)) % len(QUESTIONS[name])]
        strict = index % 4 == 3
        tools = [tool(name, strict=strict) for name in names]
        named = index % 2 == 1
        choice: Any = {"type": "function", "function": {"name": name}} if named else "required"
        bodies.append(
            {
                "messages": [{"role": "user", "content": question}],
                "tools": tools,
                "tool_choice": choice,
                "temperature": 1.0,
                "max_tokens": max_tokens,
            }
        )
    return bodies


def verdict(body: dict[str, Any], response: dict[str, Any]) -> str:
    """'valid', or what is wrong with the reply."""
    choice = response["choices"][0]
    calls = (choice.get("message") or {}).get("tool_calls") or []
    if not calls:
        return f"no call (finish_reason={choice.get('finish_reason')})"
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in body["tools"]}
    named = body["tool_choice"]
    if isinstance(named, dict) and calls[0]["function"]["name"] != named["function"]["name"]:
        return "another tool than the named one"
    for call in calls:
        function = call["function"]
        if function["name"] not in schemas:
            return "a tool not offered"
        try:
            arguments = json.loads(function["arguments"])
        except (TypeError, json.JSONDecodeError):
            return "arguments not JSON"
        try:
            jsonschema.validate(arguments, schemas[function["name"]])
        except jsonschema.ValidationError as e:
            return f"arguments do not fit the schema ({e.validator})"
    return "valid"


async def run_path(
    send, bodies: list[dict[str, Any]], concurrency: int, failures: list[dict[str, Any]]
) -> Counter:
    """Send every body (`concurrency` at once); the count of each verdict. Each failed
    reply's message and finish reason go to `failures`."""
    limit = asyncio.Semaphore(concurrency)
    seen: Counter = Counter()
    examples: dict[str, str] = {}

    async def one(index: int, body: dict[str, Any]) -> str:
        async with limit:
            try:
                response = await send(body)
            except Exception as e:  # a refused request counts as a failure, with its kind
                return f"error: {type(e).__name__}: {str(e)[:80]}"
        found = verdict(body, response)
        seen[found == "valid"] += 1
        if found == "valid":  # one call of each tool, to show what the bounds leave
            for call in response["choices"][0]["message"]["tool_calls"]:
                function = call["function"]
                examples.setdefault(function["name"], function["arguments"])
        # progress on stderr: a run cut short still says how far it got
        print(f"{seen[True]} valid of {sum(seen.values())}", file=sys.stderr, flush=True)
        if found != "valid":
            choice = response["choices"][0]
            failures.append(
                {
                    "request": index,
                    "verdict": found,
                    "finish_reason": choice.get("finish_reason"),
                    "message": choice.get("message"),
                }
            )
        return found

    verdicts = Counter(await asyncio.gather(*(one(i, b) for i, b in enumerate(bodies))))
    for name, arguments in sorted(examples.items()):
        print(f"  e.g. {name}({arguments})")
    return verdicts


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--paths", default="endpoint,direct")
    parser.add_argument("--failures", help="write the failed replies to this JSON file")
    args = parser.parse_args()
    import tempfile

    from openai import AsyncOpenAI

    bodies = requests(args.count, args.max_tokens)
    with tempfile.TemporaryDirectory() as root:
        backend = LocalBackend(root, engine={"kind": "vllm"})
        started = time.perf_counter()
        await backend.start(args.model)
        print(f"{args.model}: engine up in {time.perf_counter() - started:.0f} s")
        gateway, engine = backend.gateway, backend.engine
        assert gateway is not None and engine is not None
        parser = getattr(engine, "tool_call_parser", None)
        sizes, _ = forced_call(bodies[0], parser, args.max_tokens).plan()
        print(f"{args.model}: {parser} envelope; free-value size k by tool: {sizes}")
        client = AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)

        async def endpoint(body: dict[str, Any]) -> dict[str, Any]:
            reply = await client.chat.completions.create(model=engine.base_name, **body)
            return reply.model_dump()

        async def direct(body: dict[str, Any]) -> dict[str, Any]:
            return await gateway.call(engine.chat({**body, "model": engine.base_name}))

        failures: dict[str, list[dict[str, Any]]] = {}
        try:
            for name in args.paths.split(","):
                send = {"endpoint": endpoint, "direct": direct}[name]
                started = time.perf_counter()
                failed = failures.setdefault(name, [])
                counts = await run_path(send, bodies, args.concurrency, failed)
                valid = counts.pop("valid", 0)
                took = time.perf_counter() - started
                print(
                    f"{args.model} | {name} | valid {valid}/{len(bodies)} | {took:.0f} s | "
                    + "; ".join(f"{k}: {v}" for k, v in counts.most_common())
                )
        finally:
            await backend.close()
            if args.failures:
                text = json.dumps(failures, indent=1)
                await asyncio.to_thread(Path(args.failures).write_text, text)


if __name__ == "__main__":
    asyncio.run(main())
