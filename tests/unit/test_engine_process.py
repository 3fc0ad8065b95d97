"""What an engine subprocess is started with: a private socket, no secret on its command
line, no server key in its environment (the vLLM command is built, not run)."""

import os

from rlcoach.config import EngineConfig
from rlcoach.engines.process import child_environment
from rlcoach.engines.vllm import VLLMEngine


def test_vllm_gets_a_private_socket_and_its_own_key_only_in_its_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RLCOACH_API_KEY", "server-secret")
    (tmp_path / "config.json").write_text("{}")
    engine = VLLMEngine(tmp_path, "base", EngineConfig(), tmp_path / "vllm.log")
    engine._key = "engine-key"
    command = engine.command(engine.socket_path)
    assert command[command.index("--uds") + 1] == str(engine.socket_path)
    assert "--port" not in command and "--host" not in command
    assert not any("secret" in arg or "engine-key" in arg for arg in command)
    assert os.stat(engine.socket_path.parent).st_mode & 0o777 == 0o700
    env = engine.environment()
    assert env["VLLM_API_KEY"] == "engine-key" and "RLCOACH_API_KEY" not in env
    assert "RLCOACH_API_KEY" not in child_environment({"X": "1"})


def test_any_error_body_of_the_engine_becomes_openai_shaped():
    from rlcoach.engines.http import EngineResponse
    from rlcoach.engines.process import _error_body

    for response in (
        EngineResponse(500, b"Internal Server Error"),
        EngineResponse(500, b""),
        EngineResponse(401, b'{"error": "Unauthorized"}'),
        EngineResponse(400, b'["not", "an", "object"]'),
        EngineResponse(400, b'{"error": {"message": "bad", "type": "x", "param": null}}'),
    ):
        error = _error_body(response)["error"]
        assert isinstance(error["message"], str) and error["message"]
