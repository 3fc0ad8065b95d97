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
