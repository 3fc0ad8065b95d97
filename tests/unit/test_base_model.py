"""Base models named by a Hugging Face hub id, resolved from a hub cache on disk.

The cache is the `hub_cache` fixture (conftest.py): laid out as `huggingface_hub` lays one
out, because this machine cannot reach a hub. Resolution is the real `huggingface_hub`
code reading it offline.
"""

from pathlib import Path

import pytest

from rlcoach import ConfigError, TrainableModel
from rlcoach.models.base_model import (
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


def test_vllm_is_handed_the_snapshot_under_the_hub_id(offline, monkeypatch, tmp_path):
    """The vLLM command is built, not run. A second revision, `base`, is laid out beside
    `main` without a chat template (a base model), so the family's template is written
    for vLLM beside its log, named for the id without a folder per organisation."""
    import shutil

    from rlcoach.config import EngineConfig
    from rlcoach.engines.vllm import VLLMEngine

    home = tmp_path / "hf-home"
    shutil.copytree(offline.hf_home / "hub", home / "hub", symlinks=True)
    monkeypatch.setenv("HF_HOME", str(home))
    repo = home / "hub" / "models--rlcoach-test--tiny-llama"
    base = repo / "snapshots" / ("b" * 40)
    base.mkdir()
    for link in (repo / "snapshots" / offline.commit).iterdir():
        if link.name != "chat_template.jinja":
            (base / link.name).symlink_to(link.readlink())
    (repo / "refs" / "base").write_text("b" * 40)

    for revision, snapshot in (("main", repo / "snapshots" / offline.commit), ("base", base)):
        model_id = f"{offline.repo_id}@{revision}"
        engine = VLLMEngine(
            resolve_base_model(model_id),
            served_base_name(model_id),
            EngineConfig(),
            tmp_path / "logs" / f"vllm-{revision}.log",
        )
        command = engine.command(engine.socket_path)
        assert command[command.index("--model") + 1] == str(snapshot)
        assert command[command.index("--served-model-name") + 1] == offline.repo_id
        assert ("--chat-template" in command) == (revision == "base")
    template = Path(command[command.index("--chat-template") + 1])
    assert template == tmp_path / "logs" / "rlcoach-test--tiny-llama-chat-template.jinja"
    assert "<|im_start|>" in template.read_text()
