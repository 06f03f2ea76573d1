"""The HTTP edge of `gyre serve` over real HTTP (issue 9): POST bodies must be
declared as JSON (415), CORS stays closed unless `--cors-allow-origin` opens
it, one JSON nesting limit and list limits are enforced before anything
reaches the service (400, never 5xx), unknown models get one 404 format on
every route, and the input decisions: whole-number floats are integers,
`top_p: 0` is greedy, `prompt: null` is a 400 saying why, and `model: ""`
is served (and named) as the default model."""

from __future__ import annotations

import http.client
import json

import pytest

import harness
import openai_schema
from conftest import QWEN

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
POST_ROUTES = [CHAT, COMPLETIONS, "/tokenize", "/detokenize"]
MESSAGES = [{"role": "user", "content": "hi"}]
MAX_JSON_DEPTH = 32  # shim/src/limits.rs


def body_for(path: str, model: str = QWEN) -> dict:
    if path == CHAT:
        return {"model": model, "messages": MESSAGES, "max_tokens": 2}
    if path == "/detokenize":
        return {"model": model, "tokens": [1, 2]}
    return {"model": model, "prompt": "hi", "max_tokens": 2}


def raw_post(address: str, path: str, body: bytes, headers: dict) -> harness.HttpReply:
    """A POST with exactly `headers` (http.client adds only Host and Content-Length)."""
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        return harness.HttpReply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def error_of(reply: harness.HttpReply, status: int) -> dict:
    assert reply.status == status, f"expected HTTP {status}, got {reply.status}: {reply.body[:500]!r}"
    body = reply.json()
    openai_schema.validate(openai_schema.ERROR, body)
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def nested(levels: int):
    """{"a": {"a": ... 1}} with `levels` levels of objects."""
    value = 1
    for _ in range(levels):
        value = {"a": value}
    return value


@pytest.mark.parametrize("content_type", [
    "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x", None,
], ids=["text", "text-charset", "form", "multipart", "none"])
@pytest.mark.parametrize("path", POST_ROUTES)
def test_non_json_content_type_is_415(qwen, path, content_type):
    headers = {} if content_type is None else {"Content-Type": content_type}
    reply = raw_post(qwen.http, path, json.dumps(body_for(path)).encode(), headers)
    err = error_of(reply, 415)
    assert (err["type"], err["code"]) == ("invalid_request_error", "unsupported_media_type")
    assert "application/json" in err["message"]


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "APPLICATION/JSON",
                                          "application/vnd.example+json"])
def test_json_content_types_are_served(qwen, content_type):
    reply = raw_post(qwen.http, COMPLETIONS, json.dumps(body_for(COMPLETIONS)).encode(),
                     {"Content-Type": content_type})
    assert reply.status == 200, reply.body


def preflight(address: str, origin: str) -> harness.HttpReply:
    return harness.http_request(address, "OPTIONS", CHAT, headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})


def test_cors_is_closed_by_default(qwen):
    reply = preflight(qwen.http, "https://evil.example")
    assert "access-control-allow-origin" not in reply.headers
    assert reply.status == 405
    reply = harness.http_request(qwen.http, "GET", "/v1/models", headers={"Origin": "https://evil.example"})
    assert reply.status == 200 and "access-control-allow-origin" not in reply.headers


def test_cors_opens_for_configured_origins(start_server):
    server = start_server(QWEN, "--cors-allow-origin", "https://app.example",
                          "--cors-allow-origin", "https://b.example,https://c.example")
    for origin in ["https://app.example", "https://c.example"]:
        reply = preflight(server.http, origin)
        assert 200 <= reply.status < 300, reply.body
        assert reply.headers["access-control-allow-origin"] == origin
        assert "POST" in reply.headers["access-control-allow-methods"]
    reply = harness.http_json(server.http, COMPLETIONS, body_for(COMPLETIONS), headers={"Origin": "https://b.example"})
    assert reply.status == 200 and reply.headers["access-control-allow-origin"] == "https://b.example"
    reply = preflight(server.http, "https://evil.example")
    assert "access-control-allow-origin" not in reply.headers


def test_standalone_shim_takes_cors_origins_from_the_environment(qwen, monkeypatch):
    monkeypatch.setenv("GYRE_CORS_ALLOW_ORIGIN", "https://app.example,https://b.example")
    shim = harness.Server.start(
        [str(harness.SHIM_BIN), "--grpc-endpoint", f"http://{qwen.grpc}", "--http-addr", "127.0.0.1:0"],
        want=("HTTP",))
    try:
        reply = preflight(shim.http, "https://b.example")
        assert 200 <= reply.status < 300 and reply.headers["access-control-allow-origin"] == "https://b.example"
        reply = preflight(shim.http, "https://evil.example")
        assert "access-control-allow-origin" not in reply.headers
        reply = raw_post(shim.http, COMPLETIONS, json.dumps(body_for(COMPLETIONS)).encode(), {"Content-Type": "text/plain"})
        assert error_of(reply, 415)["code"] == "unsupported_media_type"
    finally:
        shim.stop()
        shim.remove_log()


def test_kwargs_nested_49_levels_is_400_not_500(qwen):
    body = {**body_for(CHAT), "chat_template_kwargs": {"deep": nested(48)}}
    err = error_of(harness.http_json(qwen.http, CHAT, body), 400)
    assert (err["param"], err["code"]) == ("chat_template_kwargs", "nesting_too_deep")
    assert str(MAX_JSON_DEPTH) in err["message"]


@pytest.mark.parametrize("path", [CHAT, "/tokenize"])
def test_nesting_at_the_limit_is_served(qwen, path):
    """The body is level 1 and the kwargs object level 2: the service decodes
    all of it (the protobuf decoder's own recursion limit is not reached)."""
    body = {"model": QWEN, "messages": MESSAGES, "max_tokens": 2,
            "chat_template_kwargs": {"deep": nested(MAX_JSON_DEPTH - 2)}}
    reply = harness.http_json(qwen.http, path, body)
    assert reply.status == 200, reply.body


def test_too_many_tools_is_400_naming_the_limit(qwen):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    err = error_of(harness.http_json(qwen.http, CHAT, {**body_for(CHAT), "tools": [tool] * 129}), 400)
    assert (err["param"], err["code"]) == ("tools", "too_many_items")
    assert "128" in err["message"]


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS, "/tokenize", "/detokenize"])
@pytest.mark.parametrize("model", ["nope", "x" * 3000], ids=["short", "long"])
def test_unknown_model_has_one_404_format(qwen, path, model):
    err = error_of(harness.http_json(qwen.http, path, body_for(path, model)), 404)
    shown = model if len(model) <= 256 else model[:256] + "…"
    assert err == {"message": f"the model `{shown}` does not exist", "type": "invalid_request_error",
                   "param": "model", "code": "model_not_found"}


def test_unknown_model_retrieve_has_the_same_format(qwen):
    err = error_of(harness.http_request(qwen.http, "GET", "/v1/models/nope"), 404)
    assert err == {"message": "the model `nope` does not exist", "type": "invalid_request_error",
                   "param": "model", "code": "model_not_found"}


def test_whole_number_floats_are_integers(qwen):
    body = {"model": QWEN, "prompt": "hi", "n": 2.0, "max_tokens": 3.0, "seed": 3.0, "logprobs": 1.0}
    reply = harness.http_json(qwen.http, COMPLETIONS, body)
    assert reply.status == 200, reply.body
    out = reply.json()
    assert len(out["choices"]) == 2 and out["usage"]["completion_tokens"] <= 6
    body = {"model": QWEN, "messages": MESSAGES, "max_completion_tokens": 2.0, "logprobs": True, "top_logprobs": 2.0}
    reply = harness.http_json(qwen.http, CHAT, body)
    assert reply.status == 200, reply.body
    assert len(reply.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 2
    err = error_of(harness.http_json(qwen.http, COMPLETIONS, {**body_for(COMPLETIONS), "n": 2.5}), 400)
    assert err["param"] == "n"


def test_top_p_zero_is_greedy(qwen):
    base = {"model": QWEN, "prompt": "Once upon a time", "max_tokens": 8, "ignore_eos": True}
    greedy = harness.http_json(qwen.http, COMPLETIONS, {**base, "temperature": 0})
    assert greedy.status == 200, greedy.body
    for seed in (1, 2, 3):
        reply = harness.http_json(qwen.http, COMPLETIONS, {**base, "temperature": 1.5, "top_p": 0, "seed": seed})
        assert reply.status == 200, reply.body
        assert reply.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]


def test_null_prompt_is_400_saying_why(qwen):
    err = error_of(harness.http_json(qwen.http, COMPLETIONS, {**body_for(COMPLETIONS), "prompt": None}), 400)
    assert err["param"] == "prompt" and "null" in err["message"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_empty_model_is_the_default_model_by_name(qwen, path, stream):
    body = {**body_for(path, ""), "stream": stream}
    if stream:
        reply = harness.http_sse(qwen.http, path, body)
        assert reply.status == 200 and reply.done, reply.raw[:500]
        models = {c["model"] for c in reply.chunks()}
    else:
        reply = harness.http_json(qwen.http, path, body)
        assert reply.status == 200, reply.body
        models = {reply.json()["model"]}
    assert models == {QWEN}
