"""Who may use `rlcoach serve`: the bind rule, and Host/Origin/key checks on a real app."""

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from rlcoach.errors import ConfigError
from rlcoach.serve.access import AccessGuard, check_exposure


def test_a_keyless_bind_beyond_loopback_needs_insecure():
    for host in ("127.0.0.1", "::1", "localhost"):
        check_exposure(host, None, insecure=False)
    check_exposure("0.0.0.0", "key", insecure=False)
    check_exposure("0.0.0.0", None, insecure=True)
    with pytest.raises(ConfigError, match="--insecure"):
        check_exposure("0.0.0.0", None, insecure=False)


def app(**options) -> httpx.AsyncClient:
    async def ok(request):
        return PlainTextResponse("ok")

    inner = Starlette(routes=[Route("/x", ok, methods=["GET", "POST"]), Route("/health", ok)])
    guard = AccessGuard(inner, **options)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=guard), base_url="http://127.0.0.1")


@pytest.mark.parametrize(
    "headers,status,code",
    [
        ({}, 200, None),
        ({"host": "localhost:8000"}, 200, None),
        ({"host": "[::1]:8000"}, 200, None),
        ({"host": "evil.example:8000"}, 403, "host_not_allowed"),
        ({"origin": "http://evil.example"}, 403, "origin_not_allowed"),
        ({"origin": "https://app.example/"}, 200, None),
    ],
)
async def test_host_and_origin_on_a_loopback_bind(headers, status, code):
    async with app(api_key=None, allowed_origins=["https://app.example"]) as http:
        response = await http.post("/x", headers=headers, content=b"x")
    assert response.status_code == status
    if code:
        assert response.json()["error"]["code"] == code


async def test_other_binds_check_hosts_only_when_named():
    async with app(api_key="k", bind_host="0.0.0.0") as http:
        response = await http.get("/x", headers={"host": "gpu-box:8000", "x-api-key": "k"})
        assert response.status_code == 200
        assert (await http.get("/x", headers={"host": "gpu-box"})).status_code == 401
        assert (await http.get("/health", headers={"host": "gpu-box"})).status_code == 200
    async with app(api_key="k", bind_host="0.0.0.0", allowed_hosts=["gpu-box"]) as http:
        response = await http.get("/x", headers={"host": "other:1", "x-api-key": "k"})
        assert response.status_code == 403
