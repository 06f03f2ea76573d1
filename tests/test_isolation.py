"""One client can never hurt another (issue 9): a storm of hostile requests
interleaved with 50 normal streams against `gyre serve`.

Every normal stream must complete with `[DONE]` and exactly the text the
same (greedy) request gives alone; every hostile request must get a 4xx in
the OpenAI error shape. Hostile requests include names long enough that an
error echoing them whole would not fit in the HTTP/2 headers of the shim's
shared connections to the service.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

import harness
import openai_schema
from conftest import QWEN, assert_no_panic

NORMAL = 50
WORKERS = 24


@pytest.fixture(scope="module")
def server():
    server = harness.serve(QWEN)
    yield server
    server.stop()
    try:
        assert_no_panic(server)
    finally:
        server.remove_log()


def normal_requests() -> list[tuple[str, dict]]:
    out = []
    for i in range(NORMAL):
        params = {"model": QWEN, "max_tokens": 12 + i % 7, "temperature": 0}
        if i % 2:
            out.append(("/v1/chat/completions",
                        {**params, "messages": [{"role": "user", "content": f"Story number {i}, please."}]}))
        else:
            out.append(("/v1/completions", {**params, "prompt": f"Once upon a time, {i} cats"}))
    return out


def nested(depth: int) -> dict:
    value: dict = {"leaf": 1}
    for _ in range(depth):
        value = {"k": value}
    return value


CHAT = {"model": QWEN, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def hostile_requests() -> list[tuple[str, bytes | str]]:
    """(path, body): each must be refused with a 4xx. (No body over the 4 MiB
    limit: its 413 comes before the body is read, and the connection closes
    under the client's feet while it still sends, see tests/test_bad_inputs.py.)"""
    def j(payload) -> str:
        return json.dumps(payload)

    return [
        ("/v1/chat/completions", j({**CHAT, "model": "m" * 20_000})),
        ("/v1/chat/completions", j({**CHAT, "model": "m" * 100_000, "stream": True})),
        ("/v1/completions", j({"model": "é" * 100_000, "prompt": "Hi", "max_tokens": 4})),
        ("/v1/chat/completions", j({**CHAT, "tools": [TOOL], "stream": True,
                                    "tool_choice": {"type": "function", "function": {"name": "f" * 100_000}}})),
        ("/v1/chat/completions", j({**CHAT, "tools": [TOOL],
                                    "tool_choice": {"type": "function", "function": {"name": "g" * 20_000}}})),
        ("/v1/chat/completions", j({**CHAT, "chat_template_kwargs": nested(49)})),
        ("/v1/chat/completions", j({**CHAT, "chat_template_kwargs": nested(400)})),
        ("/v1/completions", j({"model": QWEN, "prompt": "Hi", "max_tokens": 4, "stop": ["s" * 50_000] * 17})),
        ("/v1/completions", j({"model": QWEN, "prompt": "Hi", "max_tokens": 4, "stop": ["s" * 100_000, ""]})),
        ("/v1/chat/completions", '{"model": "' + QWEN + '", "messages": [{"role": "user", "content": "Hi"'),
        ("/v1/chat/completions", "\x00\xff garbage " * 1000),
        ("/v1/completions", j({"model": QWEN, "prompt": [10 ** 9] * 10, "max_tokens": 4})),
        ("/v1/completions", j({"model": QWEN, "prompt": "Hi", "max_tokens": 4, "n": 10 ** 6})),
    ]


def run_normal(address: str, path: str, payload: dict) -> harness.SseReply:
    return harness.http_sse(address, path, {**payload, "stream": True})


def run_hostile(address: str, path: str, body) -> harness.HttpReply:
    return harness.http_request(address, "POST", path, body)


def text_of(path: str, chunks: list[dict]) -> str:
    """The streamed text of choice 0 (chat: delta contents; completions: texts)."""
    parts = []
    for c in chunks:
        for choice in c.get("choices", []):
            if path == "/v1/chat/completions":
                parts.append((choice.get("delta") or {}).get("content") or "")
            else:
                parts.append(choice.get("text") or "")
    return "".join(parts)


def test_hostile_storm_does_not_touch_normal_streams(server):
    normals = normal_requests()
    expected = []
    for path, payload in normals:
        reply = harness.http_json(server.http, path, payload)
        assert reply.status == 200, reply.body
        choice = reply.json()["choices"][0]
        expected.append(choice["message"]["content"] if path == "/v1/chat/completions" else choice["text"])

    hostiles = hostile_requests()
    with ThreadPoolExecutor(WORKERS) as pool:
        jobs = []
        for i, (path, payload) in enumerate(normals):
            jobs.append(("normal", i, pool.submit(run_normal, server.http, path, payload)))
            h_path, h_body = hostiles[i % len(hostiles)]
            jobs.append(("hostile", i % len(hostiles), pool.submit(run_hostile, server.http, h_path, h_body)))
        results = [(kind, i, job.result()) for kind, i, job in jobs]

    failures = []
    for kind, i, reply in results:
        if kind == "normal":
            path = normals[i][0]
            if reply.status != 200 or not reply.done:
                failures.append(f"normal {i} ({path}): status {reply.status}, last events {reply.events[-2:]}")
            elif text_of(path, reply.chunks()) != expected[i]:
                failures.append(f"normal {i} ({path}): text {text_of(path, reply.chunks())!r} != {expected[i]!r}")
        else:
            if not 400 <= reply.status < 500:
                failures.append(f"hostile {i} ({hostiles[i][0]}): status {reply.status}, body {reply.body[:300]!r}")
                continue
            body = reply.json()
            openai_schema.validate(openai_schema.ERROR, body)
            if len(body["error"]["message"]) > 2000:
                failures.append(f"hostile {i}: a {len(body['error']['message'])}-character error message")
    assert not failures, "\n".join(failures)
    assert server.alive()
    # The service still serves normally afterwards.
    path, payload = normals[0]
    after = run_normal(server.http, path, payload)
    assert after.done and text_of(path, after.chunks()) == expected[0]
