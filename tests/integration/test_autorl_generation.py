"""AutoRL generation with a real generator: the bundled model behind the policy endpoint
(the session's vLLM server), over real HTTP. The 135M model is a weak generator, so this
checks the guarantees (count, schema, distinct records, usage), not the inputs' quality."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlcoach import BUNDLED_MODEL, Model
from rlcoach.autorl import (
    InputRecord,
    deduplicate,
    generate_inputs,
    generate_scenarios,
    load_records,
    split_records,
)
from rlcoach.demo.task import ADD_TOOL
from rlcoach.models.usage import ModelUsage

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def generator(policy):
    return Model(BUNDLED_MODEL, base_url=policy.api_base)


async def test_inputs_from_a_task_description(generator):
    usage = ModelUsage()
    made = await generate_inputs(
        "A calculator assistant that adds numbers for the user.",
        6,
        generator,
        usage=usage,
        progress=False,
        config={"batch_size": 4, "max_chars": 160},
    )
    assert len(made) == 6
    assert all(isinstance(r, InputRecord) and 8 <= len(r.text) <= 160 for r in made)
    assert len({r.id for r in made}) == 6
    assert deduplicate(made)[1] == [], "generated records must be distinct"
    assert usage.calls >= 2 and usage.prompt_tokens > 0 and usage.completion_tokens > 0


async def test_scenarios_from_tools(generator):
    made = await generate_scenarios(
        [ADD_TOOL], 3, generator, progress=False, config={"batch_size": 3, "max_chars": 160}
    )
    assert len(made) == 3
    assert all(r.difficulty in ("easy", "medium", "hard") for r in made)
    assert all(r.metadata["kind"] == "scenario" for r in made)


def test_the_cli_writes_a_reproducible_split(policy, tmp_path):
    command = [
        str(Path(sys.executable).with_name("rlcoach")),
        "autorl",
        "generate",
        "A calculator assistant that adds numbers for the user.",
        "--n",
        "5",
        "--out",
        str(tmp_path / "data"),
        "--generator-url",
        policy.api_base,
        "--batch-size",
        "5",
        "--eval-fraction",
        "0.4",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    train = load_records(tmp_path / "data" / "train.jsonl")
    evaluation = load_records(tmp_path / "data" / "eval.jsonl")
    manifest = json.loads((tmp_path / "data" / "dataset.json").read_text())
    assert len(train) + len(evaluation) == 5
    assert (manifest["train"], manifest["eval"]) == (len(train), len(evaluation))
    assert manifest["usage"]["calls"] >= 2 and manifest["embeddings"] is True
    assert split_records([*train, *evaluation], 0.4, 0) == (train, evaluation)
    assert f"wrote {len(train)} train and {len(evaluation)} eval inputs" in done.stdout
