"""Refusals: the HTTP errors of `rlcoach serve`, answered with an OpenAI-shaped body.

A route of the server (server.py), the training-request lifecycle (training_requests.py)
or a registration (registrations.py) raises `Refusal` with the status, the message
(what is wrong and the fix) and OpenAI's `code`/`param`/`type` fields; the server's
exception handler turns it into the response. 429 and 503 carry `Retry-After`, which
OpenAI clients honour.
"""

from __future__ import annotations

from starlette.responses import JSONResponse

from rlcoach.errors import RLCoachError
from rlcoach.serve.wire import error_body

__all__ = ["Refusal"]


class Refusal(RLCoachError):
    """An HTTP error to answer with an OpenAI-shaped body; retryable when its status says
    the same request may work later (408, 429, 503)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.param, self.kind = status, code, param, kind
        self.retryable = status in (408, 429, 503)

    def response(self) -> JSONResponse:
        body = error_body(str(self), kind=self.kind, param=self.param, code=self.code)
        headers = {"Retry-After": "5"} if self.status in (429, 503) else None
        return JSONResponse(body, status_code=self.status, headers=headers)
