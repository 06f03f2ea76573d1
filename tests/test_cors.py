"""CORS allow-list (issue 14) under the name the issue uses, `--cors-origin`
(the same flag as `--cors-allow-origin`), over real HTTP: preflight and
actual requests from an allowed and a refused origin, and CORS headers on
error answers too (a browser can only read an error's JSON when it carries
them)."""

from __future__ import annotations

import json

import pytest

import harness
import openai_schema
from conftest import QWEN
from conn_util import connect, read_response

ALLOWED = "https://app.example"
REFUSED = "https://evil.example"
KEY = "sekret"
CHAT = "/v1/chat/completions"
BODY = {"model": QWEN, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def server(module_server) -> harness.Server:
    return module_server(QWEN, "--cors-origin", ALLOWED, "--api-key", KEY)


def preflight(address: str, origin: str) -> harness.HttpReply:
    return harness.http_request(address, "OPTIONS", CHAT, headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, idempotency-key"})


def post(address: str, origin: str, body, headers: dict | None = None) -> harness.HttpReply:
    raw = body if isinstance(body, str) else json.dumps(body)
    return harness.http_request(address, "POST", CHAT, raw, {"Origin": origin, **(headers or {})})


def test_preflight_from_an_allowed_origin_is_granted(server):
    reply = preflight(server.http, ALLOWED)
    assert 200 <= reply.status < 300, reply.body
    assert reply.headers["access-control-allow-origin"] == ALLOWED
    assert "POST" in reply.headers["access-control-allow-methods"]
    allowed_headers = reply.headers["access-control-allow-headers"].lower()
    for name in ["authorization", "content-type", "idempotency-key"]:
        assert name in allowed_headers


def test_preflight_from_a_refused_origin_gets_no_grant(server):
    # Without Access-Control-Allow-Origin the browser refuses the request
    # (the other preflight headers grant nothing on their own).
    reply = preflight(server.http, REFUSED)
    assert "access-control-allow-origin" not in reply.headers


def test_actual_requests_carry_the_grant_only_for_allowed_origins(server):
    auth = {"Authorization": f"Bearer {KEY}"}
    ok = post(server.http, ALLOWED, BODY, auth)
    assert ok.status == 200 and ok.headers["access-control-allow-origin"] == ALLOWED
    exposed = ok.headers["access-control-expose-headers"].lower()
    assert "retry-after" in exposed and "idempotent-replayed" in exposed
    other = post(server.http, REFUSED, BODY, auth)
    # The server answers (CORS is the browser's to enforce) but grants nothing.
    assert other.status == 200 and "access-control-allow-origin" not in other.headers


def _error(reply: harness.HttpReply, status: int) -> dict:
    assert reply.status == status, reply.body
    openai_schema.validate(openai_schema.ERROR, reply.json())
    return reply.json()["error"]


def test_errors_carry_cors_headers(server):
    auth = {"Authorization": f"Bearer {KEY}"}
    cases = [
        (post(server.http, ALLOWED, BODY), 401, "invalid_api_key"),
        (post(server.http, ALLOWED, {**BODY, "model": "no-such-model"}, auth), 404, "model_not_found"),
        (post(server.http, ALLOWED, {**BODY, "temperature": -1}, auth), 400, None),
        (post(server.http, ALLOWED, "{not json", auth), 400, None),
        (post(server.http, ALLOWED, BODY, {**auth, "Idempotency-Key": ""}), 400, "invalid_idempotency_key"),
    ]
    for reply, status, code in cases:
        err = _error(reply, status)
        if code:
            assert err["code"] == code
        assert reply.headers.get("access-control-allow-origin") == ALLOWED, (status, reply.headers)
    refused = post(server.http, REFUSED, BODY)
    assert _error(refused, 401) and "access-control-allow-origin" not in refused.headers


def test_the_body_timeout_408_carries_cors_headers(module_server):
    server = module_server(QWEN, "--cors-origin", ALLOWED, "--body-timeout", "1")
    sock = connect(server.http)
    try:
        sock.sendall(("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Origin: {ALLOWED}\r\nContent-Length: 100\r\n\r\n{{").encode())
        status, headers, body = read_response(sock)  # the socket's timeout bounds the wait
    finally:
        sock.close()
    assert status == 408, body
    assert json.loads(body)["error"]["code"] == "request_timeout"
    assert headers.get("access-control-allow-origin") == ALLOWED, headers


def test_standalone_shim_takes_cors_origin(qwen):
    shim = harness.Server.start(
        [str(harness.SHIM_BIN), "--grpc-endpoint", f"http://{qwen.grpc}", "--http-addr", "127.0.0.1:0",
         "--cors-origin", ALLOWED], want=("HTTP",))
    try:
        reply = preflight(shim.http, ALLOWED)
        assert 200 <= reply.status < 300 and reply.headers["access-control-allow-origin"] == ALLOWED
        assert "access-control-allow-origin" not in preflight(shim.http, REFUSED).headers
    finally:
        shim.stop()
        shim.remove_log()


# ---------------------------------------------------------------------------
# The gRPC port (gRPC-Web)

GRPC_WEB_HEADERS = "authorization,content-type,x-grpc-web,x-user-agent"
# An empty ListModelsRequest in one gRPC-Web data frame.
LIST_MODELS = b"\x00\x00\x00\x00\x00"


def grpc_preflight(address: str, origin: str) -> harness.HttpReply:
    return harness.http_request(address, "OPTIONS", "/gyre.v1.Generation/GenerateStream", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": GRPC_WEB_HEADERS})


def grpc_web_list_models(address: str, origin: str, headers: dict | None = None) -> harness.HttpReply:
    return harness.http_request(address, "POST", "/gyre.v1.Generation/ListModels", LIST_MODELS, {
        "Content-Type": "application/grpc-web+proto", "X-Grpc-Web": "1", "Origin": origin, **(headers or {})})


def assert_granted(reply: harness.HttpReply, origin: str) -> None:
    assert 200 <= reply.status < 300, reply
    assert reply.headers.get("access-control-allow-origin") == origin, reply.headers
    assert "POST" in reply.headers["access-control-allow-methods"]
    allowed = reply.headers["access-control-allow-headers"].lower()
    for name in GRPC_WEB_HEADERS.split(","):
        assert name in allowed, allowed


def test_the_grpc_port_grants_the_same_origins_for_grpc_web(server):
    assert_granted(grpc_preflight(server.grpc, ALLOWED), ALLOWED)
    assert "access-control-allow-origin" not in grpc_preflight(server.grpc, REFUSED).headers
    # A call without the key: refused by the server (trailers-only, the
    # status in the headers), with the grant and that status readable.
    refused = grpc_web_list_models(server.grpc, ALLOWED)
    assert refused.headers.get("grpc-status") == "16", refused.headers
    assert refused.headers.get("access-control-allow-origin") == ALLOWED
    exposed = refused.headers["access-control-expose-headers"].lower()
    assert "grpc-status" in exposed and "grpc-message" in exposed, exposed
    # With the key: answered, models in the data frame, status 0 in the trailers.
    ok = grpc_web_list_models(server.grpc, ALLOWED, {"Authorization": f"Bearer {KEY}"})
    assert ok.status == 200 and ok.headers.get("access-control-allow-origin") == ALLOWED, ok
    assert QWEN.encode() in ok.body and b"grpc-status:0" in ok.body.replace(b" ", b""), ok.body
    # Another origin is answered too (CORS is the browser's to enforce) but granted nothing.
    other = grpc_web_list_models(server.grpc, REFUSED, {"Authorization": f"Bearer {KEY}"})
    assert other.status == 200 and "access-control-allow-origin" not in other.headers


def test_without_the_playground_the_grpc_port_grants_the_origins_only(module_server):
    server = module_server(QWEN, "--cors-origin", f"{ALLOWED}, http://127.0.0.1:3000", "--no-playground")
    for origin in (ALLOWED, "http://127.0.0.1:3000"):
        assert_granted(grpc_preflight(server.grpc, origin), origin)
    page = f"http://{server.http}"
    for origin in (page, REFUSED):
        assert "access-control-allow-origin" not in grpc_preflight(server.grpc, origin).headers, origin
    ok = grpc_web_list_models(server.grpc, ALLOWED)
    assert ok.status == 200 and ok.headers.get("access-control-allow-origin") == ALLOWED, ok
    assert QWEN.encode() in ok.body
