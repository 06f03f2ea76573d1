"""OpenAI-shaped errors of the HTTP shim, on raw HTTP (`http.client`).

Every error must have the right status and the body
`{"error": {"message", "type", "param", "code"}}` (validated against the
spec's ErrorResponse): malformed bodies, missing and mistyped parameters,
out-of-range values, unknown models, prompts that do not fit the context
(answered before any SSE byte, streaming or not), unknown routes, wrong
methods, and missing or wrong API keys.
"""

from __future__ import annotations

import pytest

import harness
import openai_schema
from conftest import API_KEY, QWEN

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "hi"}]


def error_of(reply: harness.HttpReply, status: int) -> dict:
    """The validated `error` object of a reply that must have `status`."""
    assert reply.status == status, f"expected HTTP {status}, got {reply.status}: {reply.body[:500]!r}"
    assert reply.headers.get("content-type", "").startswith("application/json"), reply.headers
    body = reply.json()
    openai_schema.validate(openai_schema.ERROR, body)
    err = body["error"]
    assert err["message"], "the error message must not be empty"
    return err


@pytest.mark.parametrize("raw", ["{bad json", '{"model": "tiny-qwen2",', ""], ids=["garbage", "truncated", "empty"])
def test_invalid_json_is_400(qwen, raw):
    err = error_of(harness.http_request(qwen.http, "POST", CHAT, raw), 400)
    assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize("raw", ["[1, 2]", '"text"', "null"], ids=["array", "string", "null"])
def test_non_object_body_is_400(qwen, raw):
    err = error_of(harness.http_request(qwen.http, "POST", CHAT, raw), 400)
    assert err["type"] == "invalid_request_error"


def test_missing_messages_is_400(qwen):
    err = error_of(harness.http_json(qwen.http, CHAT, {"model": QWEN}), 400)
    assert err["param"] == "messages"


def test_missing_prompt_is_400(qwen):
    err = error_of(harness.http_json(qwen.http, COMPLETIONS, {"model": QWEN}), 400)
    assert err["param"] == "prompt"


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_mistyped_temperature_is_400(qwen, path):
    body = {"model": QWEN, "messages": MESSAGES, "prompt": "hi", "temperature": "hot"}
    err = error_of(harness.http_json(qwen.http, path, body), 400)
    assert (err["type"], err["param"]) == ("invalid_request_error", "temperature")


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_out_of_range_temperature_is_400(qwen, path):
    body = {"model": QWEN, "messages": MESSAGES, "prompt": "hi", "temperature": 5, "max_tokens": 2}
    err = error_of(harness.http_json(qwen.http, path, body), 400)
    assert (err["type"], err["param"]) == ("invalid_request_error", "temperature")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_unknown_model_is_404(qwen, path, stream):
    body = {"model": "nope", "messages": MESSAGES, "prompt": "hi", "max_tokens": 2, "stream": stream}
    err = error_of(harness.http_json(qwen.http, path, body), 404)
    assert (err["type"], err["code"]) == ("invalid_request_error", "model_not_found")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_prompt_too_long_is_400_before_any_event(qwen, path, stream):
    body = {"model": QWEN, "messages": MESSAGES, "prompt": "hi", "max_tokens": 100000, "stream": stream}
    reply = harness.http_json(qwen.http, path, body)
    assert b"data:" not in reply.body, "the error must come before any SSE event"
    err = error_of(reply, 400)
    assert err["type"] == "invalid_request_error"


def test_unknown_route_is_404(qwen):
    err = error_of(harness.http_request(qwen.http, "GET", "/v1/nope"), 404)
    assert err["type"] == "invalid_request_error"
    error_of(harness.http_request(qwen.http, "POST", "/v2/chat/completions", "{}"), 404)


def test_wrong_method_is_405(qwen):
    error_of(harness.http_request(qwen.http, "GET", CHAT), 405)
    error_of(harness.http_request(qwen.http, "DELETE", COMPLETIONS), 405)


def test_unknown_model_retrieve_is_404(qwen):
    err = error_of(harness.http_request(qwen.http, "GET", "/v1/models/nope"), 404)
    assert err["code"] == "model_not_found"


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic c2VrcmV0"}],
                         ids=["none", "wrong", "not-bearer"])
@pytest.mark.parametrize("path", ["/v1/models", COMPLETIONS])
def test_missing_or_wrong_api_key_is_401(keyed, headers, path):
    payload = {"model": QWEN, "prompt": "hi", "max_tokens": 2} if path == COMPLETIONS else None
    err = error_of(harness.http_json(keyed.http, path, payload, headers=headers), 401)
    assert err["type"] == "authentication_error"


def test_right_api_key_is_accepted(keyed):
    reply = harness.http_json(keyed.http, "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
    assert reply.status == 200, reply.body
    openai_schema.validate(openai_schema.MODEL_LIST, reply.json())
