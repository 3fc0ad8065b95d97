"""How `rlcoach serve` listens and what it accepts: `ServeConfig`.

The CLI builds it from its options (`rlcoach serve --help`); `PolicyServer` (server.py)
reads its limits (body sizes, the chat queue, pending trainings, timeouts), its access
settings (bind, allowed hosts and origins, TLS) and the retention policy applied after
each step. Validated once, like every rlcoach config (validation.py).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ConfigDict, Field, model_validator

from rlcoach.backend.retention import RetentionConfig
from rlcoach.config import EngineConfig
from rlcoach.models.bundled import BUNDLED_MODEL
from rlcoach.paths import DEFAULT_ROOT
from rlcoach.validation import Config

__all__ = ["ServeConfig"]

MiB = 1024 * 1024


class ServeConfig(Config):
    """How `rlcoach serve` listens and what it accepts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    """Interface to bind; anything but loopback exposes the server (use a key)."""
    port: int = Field(8000, ge=0, le=65535)
    root: Path = DEFAULT_ROOT
    """Where runs are written (checkpoints, trajectories, metrics)."""
    base_model: str = BUNDLED_MODEL
    """The one base model this server serves (bundled name or a local folder)."""
    engine: EngineConfig = Field(default_factory=EngineConfig)
    max_request_bytes: int = Field(64 * MiB, ge=1024)
    """Largest training upload; bigger answers 413."""
    max_chat_bytes: int = Field(8 * MiB, ge=1024)
    """Largest chat request; bigger answers 413."""
    max_concurrent_chats: int = Field(256, ge=1)
    """Chat requests sent to the engine at once; more wait in the queue."""
    max_queued_chats: int = Field(1024, ge=0)
    """Chat requests allowed to wait; one more answers 429."""
    queue_timeout_s: float = Field(300.0, gt=0.0)
    """Longest wait for an engine slot; longer answers 429."""
    max_pending_trains: int = Field(4, ge=1)
    """Training requests uploading or running at once; one more answers 429."""
    heartbeat_s: float = Field(5.0, gt=0.0)
    """Seconds between heartbeat events while a step runs."""
    upstream_timeout_s: float = Field(600.0, gt=0.0)
    """Timeout of each call to the gateway (and so to the engine)."""
    upload_timeout_s: float = Field(300.0, gt=0.0)
    """Longest time a request body may take to arrive; longer answers 408."""
    insecure: bool = False
    """Allow a bind other than loopback without an API key (refused otherwise)."""
    allowed_hosts: list[str] = Field(default_factory=list)
    """More names the `Host` header may carry (loopback names are allowed on a loopback
    bind; on another bind, given names turn the check on)."""
    allowed_origins: list[str] = Field(default_factory=list)
    """Web origins whose requests are accepted (`https://app.example`); others get 403."""
    ssl_certfile: Path | None = None
    """Serve HTTPS with this certificate (PEM); needs `ssl_keyfile`."""
    ssl_keyfile: Path | None = None
    """The certificate's private key (PEM)."""
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    """What is pruned after each step (checkpoints, optimizer states, requests, logs)."""

    @model_validator(mode="after")
    def _tls_pair(self) -> ServeConfig:
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError(
                "ssl_certfile and ssl_keyfile go together; fix: pass both (or neither)"
            )
        for path in (self.ssl_certfile, self.ssl_keyfile):
            if path is not None and not Path(path).is_file():
                raise ValueError(f"TLS file {str(path)!r} does not exist")
        return self
