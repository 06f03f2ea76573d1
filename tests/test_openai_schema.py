"""Wire conformance of the HTTP shim to the official OpenAI OpenAPI spec.

Requests go out on raw HTTP (`http.client`) so that exactly what the server
sent is validated: every non-stream response, every SSE chunk, the models
list and model objects (see openai_schema.py for how the spec is loaded and
the one documented relaxation for streamed legacy completion chunks). SSE
framing is checked too: `text/event-stream`, JSON chunks, `data: [DONE]` last.
"""

from __future__ import annotations

import pytest

import harness
import openai_schema as spec
from conftest import QWEN

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
VARIANTS = {
    "greedy": {"temperature": 0, "max_tokens": 5},
    "sampled": {"temperature": 0.8, "top_p": 0.9, "seed": 7, "max_tokens": 5},
    "max_completion_tokens": {"temperature": 0, "max_completion_tokens": 3},
}


def chat_body(variant: str, **kw) -> dict:
    return {"model": QWEN, "messages": MESSAGES, **VARIANTS[variant], **kw}


def completion_body(variant: str, **kw) -> dict:
    body = {"model": QWEN, "prompt": "Roses are red,", **VARIANTS[variant], **kw}
    if "max_completion_tokens" in body:  # chat-only name
        body["max_tokens"] = body.pop("max_completion_tokens")
    return body


def ok_json(reply: harness.HttpReply) -> dict:
    assert reply.status == 200, f"HTTP {reply.status}: {reply.body[:500]!r}"
    assert reply.headers.get("content-type", "").startswith("application/json"), reply.headers
    return reply.json()


def ok_sse(reply: harness.SseReply) -> list[dict]:
    assert reply.status == 200, f"HTTP {reply.status}: {reply.raw[:500]!r}"
    assert reply.headers.get("content-type", "").startswith("text/event-stream"), reply.headers
    assert reply.done, f"the stream must end with data: [DONE]; got {reply.events[-3:]}"
    assert reply.events.count("[DONE]") == 1
    return reply.chunks()


@pytest.mark.parametrize("variant", VARIANTS)
def test_chat_completion_schema(qwen, variant):
    body = ok_json(harness.http_json(qwen.http, "/v1/chat/completions", chat_body(variant)))
    spec.validate(spec.CHAT, body)
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["finish_reason"] in ("length", "stop")


@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("variant", VARIANTS)
def test_chat_chunk_schema(qwen, variant, include_usage):
    req = chat_body(variant, stream=True, stream_options={"include_usage": include_usage})
    chunks = ok_sse(harness.http_sse(qwen.http, "/v1/chat/completions", req))
    for chunk in chunks:
        spec.validate(spec.CHAT_CHUNK, chunk)
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    finishing = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] is not None]
    assert len(finishing) == 1
    if include_usage:
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0
        assert all(c.get("usage") is None for c in chunks[:-1])
    else:
        assert all(c["choices"] for c in chunks)


@pytest.mark.parametrize("variant", VARIANTS)
def test_completion_schema(qwen, variant):
    body = ok_json(harness.http_json(qwen.http, "/v1/completions", completion_body(variant)))
    spec.validate(spec.COMPLETION, body)
    assert body["object"] == "text_completion"


@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("variant", VARIANTS)
def test_completion_chunk_schema(qwen, variant, include_usage):
    req = completion_body(variant, stream=True, stream_options={"include_usage": include_usage})
    chunks = ok_sse(harness.http_sse(qwen.http, "/v1/completions", req))
    for chunk in chunks:
        spec.validate(spec.COMPLETION_CHUNK, chunk)
    finishing = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] is not None]
    assert len(finishing) == 1
    if include_usage:
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0
    else:
        assert all(c["choices"] for c in chunks)


def test_stop_responses_schema(qwen):
    for body in (chat_body("greedy", stop=["e", "a"]), completion_body("greedy", stop="e")):
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        whole = ok_json(harness.http_json(qwen.http, path, body))
        spec.validate(spec.CHAT if "messages" in body else spec.COMPLETION, whole)
        chunks = ok_sse(harness.http_sse(qwen.http, path, {**body, "stream": True}))
        for chunk in chunks:
            spec.validate(spec.CHAT_CHUNK if "messages" in body else spec.COMPLETION_CHUNK, chunk)


def test_models_schema(qwen):
    listing = ok_json(harness.http_json(qwen.http, "/v1/models"))
    spec.validate(spec.MODEL_LIST, listing)
    assert QWEN in [m["id"] for m in listing["data"]]
    model = ok_json(harness.http_json(qwen.http, f"/v1/models/{QWEN}"))
    spec.validate(spec.MODEL, model)
    assert model["id"] == QWEN
