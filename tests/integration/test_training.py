"""Training against the real vLLM server: publish, routing, logprob agreement, crash/resume."""

import asyncio
import os
import signal
import sys
import textwrap
import time

import httpx
import pytest
import torch

from rlcoach import LocalBackend, TrainableModel, gather_trajectory_groups, load_groups, save_groups
from rlcoach.demo.task import Question, run_question

pytestmark = pytest.mark.vllm

PROMPT = [{"role": "user", "content": "Name three colours."}]


async def _greedy_logprobs(client, model_name):
    reply = await client.chat.completions.create(
        model=model_name, messages=PROMPT, max_tokens=12, temperature=0.0, logprobs=True
    )
    return reply.model, [e.logprob for e in reply.choices[0].logprobs.content]


@pytest.fixture(scope="module")
async def trained(vllm_backend):
    """`tuned` after one real step on demo rollouts (reward: the demo's, plus length so
    every group has variance), and the groups it trained on."""
    model = TrainableModel("tuned", "integration", config={"learning_rate": 2e-3})
    await model.register(vllm_backend)
    client = model.openai_client()

    async def attempt(question):
        trajectory = await run_question(model, client, question)
        trajectory.reward += 0.01 * trajectory.sampled_token_count()
        return trajectory

    questions = [Question(123, 456), Question(700, 211)]
    groups = await gather_trajectory_groups(
        [[attempt(q) for _ in range(4)] for q in questions], progress=False
    )
    before = await _greedy_logprobs(client, "tuned@0")
    result = await model.train(groups)
    return model, groups, result, before


async def test_a_step_publishes_a_new_adapter_and_routes_name_at_step(trained, vllm_backend):
    model, _, result, (base_name, base_logprobs) = trained
    assert result.step == 1 and model.served_name == "tuned@1"
    assert result.stats.trained and result.stats.sampled_tokens > 0
    checkpoint = vllm_backend.paths(model).checkpoint(1)
    assert (checkpoint / "adapter_model.safetensors").is_file()
    assert (checkpoint / "adapter_config.json").is_file()
    client = model.openai_client()
    assert base_name == "tuned@0"
    again_name, again = await _greedy_logprobs(client, "tuned@0")
    new_name, new = await _greedy_logprobs(client, "tuned")  # plain name: the latest step
    assert (again_name, new_name) == ("tuned@0", "tuned@1")
    noise = max(abs(a - b) for a, b in zip(base_logprobs, again, strict=False))
    change = max(abs(a - b) for a, b in zip(base_logprobs, new, strict=False))
    assert change > max(10 * noise, 1e-3), (noise, change)
    async with httpx.AsyncClient(base_url=vllm_backend.url) as http:
        names = [m["id"] for m in (await http.get("/v1/models")).json()["data"]]
    assert {"tuned@0", "tuned@1"} <= set(names)


async def test_vllm_logprobs_agree_with_transformers(vllm_backend, model_path, policy):
    """vLLM serves the model in bf16; the reference is fp32 transformers. Tolerance: the
    mean absolute difference of per-token logprobs under 0.05 nats and the largest under
    1.0 (bf16 rounding of 30 layers, measured about 0.01 mean here)."""
    from transformers import AutoModelForCausalLM

    from rlcoach.trainer.lora import chunked_token_logprobs

    client = policy.openai_client()
    reply = await client.chat.completions.create(
        model="calc@0",
        messages=Question(321, 654).messages(),
        max_tokens=32,
        temperature=1.0,
        seed=3,
        logprobs=True,
    )
    data = reply.model_dump()
    prompt, sampled = data["prompt_token_ids"], data["choices"][0]["token_ids"]
    engine = torch.tensor([e["logprob"] for e in data["choices"][0]["logprobs"]["content"]])
    reference_model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    ids = torch.tensor([prompt + sampled])
    with torch.no_grad():
        all_T = chunked_token_logprobs(reference_model, ids, torch.arange(ids.shape[1])[None], 512)
    reference = all_T[len(prompt) - 1 :]
    difference = (engine - reference).abs()
    print(f"logprob |vLLM - transformers|: mean {difference.mean():.4f} max {difference.max():.4f}")
    assert difference.mean() < 0.05
    assert difference.max() < 1.0


CRASHING_TRAINER = textwrap.dedent(
    """
    import asyncio, sys
    from rlcoach import LocalBackend, TrainableModel, load_groups

    async def main(root, groups_file):
        groups = load_groups(groups_file)
        model = TrainableModel("crashy", "integration")
        async with LocalBackend(root, engine={"kind": "transformers"}) as backend:
            await model.register(backend)
            await model.train(groups)
            print("step 1 saved", flush=True)
            await model.train(groups)  # killed during this step

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


async def test_killing_training_mid_step_loses_nothing_saved(trained, tmp_path):
    """The trainer runs in a subprocess (transformers engine: no second vLLM) and is killed
    with SIGKILL while step 2 trains. A save interrupted by a kill is also simulated, by
    leaving a temp checkpoint folder behind, since a kill cannot be timed into the save."""
    _, groups, _, _ = trained
    groups_file = save_groups(tmp_path / "groups.jsonl", groups)
    root = tmp_path / "runs"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CRASHING_TRAINER,
        str(root),
        str(groups_file),
        stdout=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    paths = LocalBackend(root).paths(TrainableModel("crashy", "integration"))
    try:
        assert (await process.stdout.readline()).decode().strip() == "step 1 saved"
        deadline = time.monotonic() + 120
        while not paths.trajectory_file(2).exists():
            assert time.monotonic() < deadline and process.returncode is None
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # well inside the step, which takes far longer
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
    assert process.returncode == -signal.SIGKILL
    assert sorted(p.name for p in paths.checkpoints.iterdir()) == ["000001"]
    assert load_groups(paths.trajectory_file(1)) == groups
    assert load_groups(paths.trajectory_file(2)) == groups  # saved before the step ran
    partial = paths.temp_checkpoint()
    (partial / "adapter_model.safetensors").write_bytes(b"half")

    model = TrainableModel("crashy", "integration")
    async with LocalBackend(root, engine={"kind": "transformers"}) as backend:
        await model.register(backend)
        assert model.served_name == "crashy@1"
        assert not partial.exists()
        result = await model.train(groups)
        assert result.step == 2
    assert sorted(p.name for p in paths.checkpoints.iterdir()) == ["000001", "000002"]
