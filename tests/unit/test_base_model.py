"""Base models named by a Hugging Face hub id, resolved from a hub cache on disk.

The cache is the `hub_cache` fixture (conftest.py): laid out as `huggingface_hub` lays one
out, because this machine cannot reach a hub. Resolution is the real `huggingface_hub`
code reading it offline.
"""

import pytest

from rlcoach import ConfigError, TrainableModel
from rlcoach.base_model import (
    hub_cache_dir,
    parse_hub_id,
    resolve_base_model,
    served_base_name,
)


@pytest.fixture
def offline(hub_cache, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(hub_cache.hf_home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hub_cache


def test_a_hub_id_resolves_to_its_snapshot_offline(offline):
    folder = resolve_base_model(offline.repo_id)
    assert folder == offline.snapshot
    assert (folder / "config.json").is_file()
    assert (folder / "model.safetensors").is_symlink()  # the cache's blobs, not a copy


def test_revisions_by_suffix_field_ref_and_commit(offline):
    assert resolve_base_model(f"{offline.repo_id}@v1") == offline.snapshot
    assert resolve_base_model(f"{offline.repo_id}@{offline.commit}") == offline.snapshot
    assert resolve_base_model(offline.repo_id, revision="main") == offline.snapshot
    model = TrainableModel("m", "p", base_model=offline.repo_id, revision="v1")
    assert model.base_model == f"{offline.repo_id}@v1"
    with pytest.raises(ConfigError, match="names revision 'v1' but revision='main'"):
        parse_hub_id(f"{offline.repo_id}@v1", "main")


def test_the_cache_follows_hf_hub_cache_over_hf_home(offline, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(offline.hf_home / "hub"))
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert hub_cache_dir() == offline.hf_home / "hub"
    assert resolve_base_model(offline.repo_id) == offline.snapshot


def test_a_missing_id_offline_names_the_id_the_cache_and_the_fix(offline):
    with pytest.raises(ConfigError) as error:
        resolve_base_model("Qwen/Qwen3-4B")
    text = str(error.value)
    assert "'Qwen/Qwen3-4B'" in text
    assert str(offline.hf_home / "hub" / "models--Qwen--Qwen3-4B") in text
    assert "HF_HUB_OFFLINE" in text
    assert "fix:" in text and "hf download Qwen/Qwen3-4B" in text


def test_an_unknown_revision_offline_is_refused(offline):
    with pytest.raises(ConfigError, match=r"revision 'no-such-branch'.*HF_HUB_OFFLINE"):
        resolve_base_model(f"{offline.repo_id}@no-such-branch")


def test_names_that_are_not_hub_ids():
    assert parse_hub_id("./models/tiny") is None
    assert parse_hub_id("/abs/path") is None
    assert parse_hub_id("smollm2-135m-instruct") is None
    assert served_base_name("Qwen/Qwen3-4B@abc") == "Qwen/Qwen3-4B"
    with pytest.raises(ConfigError, match="not a hub id"):
        TrainableModel("m", "p", base_model="smollm2-135m-instruct", revision="v1")
    with pytest.raises(ConfigError, match=r"neither a shipped model.*nor a hub id"):
        resolve_base_model("no-such-model")
