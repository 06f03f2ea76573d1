"""`Idempotency-Key` on the HTTP API's POST routes (issue 14), over real
HTTP against `gyre serve`: a retry of a completed request replays the stored
answer (status, body, headers, plus `Idempotent-Replayed: true`), streamed
ones as the same SSE bytes; the same key with another body or route is 422;
a retry while the first runs is 409; failed or broken-off first attempts
are not stored; keys are scoped by the `Authorization` value, expire after
`--idempotency-ttl-secs` and are bounded by `--idempotency-max-keys`."""

from __future__ import annotations

import http.client
import json
import time
import uuid

import openai
import pytest

import harness
import openai_schema
from conftest import QWEN

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
WAIT_S = 15.0

BODIES = {
    CHAT: {"model": QWEN, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 1.0},
    COMPLETIONS: {"model": QWEN, "prompt": "Once upon", "max_tokens": 4, "temperature": 1.0},
    RESPONSES: {"model": QWEN, "input": "hi", "max_output_tokens": 4, "temperature": 1.0, "store": False},
}


def new_key() -> str:
    return f"test-{uuid.uuid4()}"


def post(address: str, path: str, body, key: str | None, headers: dict | None = None) -> harness.HttpReply:
    hdrs = dict(headers or {})
    if key is not None:
        hdrs["Idempotency-Key"] = key
    raw = body if isinstance(body, str) else json.dumps(body)
    return harness.http_request(address, "POST", path, raw, hdrs)


def error_of(reply: harness.HttpReply, status: int) -> dict:
    assert reply.status == status, f"expected HTTP {status}, got {reply.status}: {reply.body[:500]!r}"
    body = reply.json()
    openai_schema.validate(openai_schema.ERROR, body)
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def replayed(reply: harness.HttpReply) -> bool:
    return reply.headers.get("idempotent-replayed") == "true"


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS, RESPONSES])
def test_a_retry_replays_the_completed_answer(qwen, path):
    key = new_key()
    first = post(qwen.http, path, BODIES[path], key)
    assert first.status == 200, first.body
    assert not replayed(first)
    again = post(qwen.http, path, BODIES[path], key)
    assert again.status == 200 and replayed(again), again.headers
    assert again.body == first.body
    assert again.headers["content-type"] == first.headers["content-type"]
    # Without the key (or with another) the request runs afresh: a new id.
    fresh = post(qwen.http, path, BODIES[path], new_key())
    assert not replayed(fresh) and fresh.json()["id"] != first.json()["id"]


def test_the_openai_sdk_gets_the_same_completion_back(qwen):
    client = openai.OpenAI(base_url=f"http://{qwen.http}/v1", api_key="unused", max_retries=0, timeout=120)
    key = new_key()
    args = dict(model=QWEN, messages=[{"role": "user", "content": "hello"}], max_tokens=4, temperature=1.0,
                extra_headers={"Idempotency-Key": key})
    first = client.chat.completions.create(**args)
    raw = client.chat.completions.with_raw_response.create(**args)
    assert raw.headers.get("idempotent-replayed") == "true"
    again = raw.parse()
    assert again.id == first.id and again.choices[0].message.content == first.choices[0].message.content


def test_the_same_body_in_another_spelling_is_the_same_request(qwen):
    key = new_key()
    body = BODIES[COMPLETIONS]
    first = post(qwen.http, COMPLETIONS, json.dumps(body), key)
    assert first.status == 200
    respelled = json.dumps(dict(reversed(list(body.items()))), indent=2)
    again = post(qwen.http, COMPLETIONS, respelled, key)
    assert replayed(again) and again.body == first.body


def test_the_same_key_with_another_body_is_422(qwen):
    key = new_key()
    assert post(qwen.http, COMPLETIONS, BODIES[COMPLETIONS], key).status == 200
    err = error_of(post(qwen.http, COMPLETIONS, {**BODIES[COMPLETIONS], "max_tokens": 5}, key), 422)
    assert (err["type"], err["code"]) == ("invalid_request_error", "idempotency_key_reused")
    err = error_of(post(qwen.http, CHAT, BODIES[CHAT], key), 422)
    assert err["code"] == "idempotency_key_reused", "another route is another request"


def _open_stream(address: str, key: str) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse, dict]:
    """A long streamed completion whose first event has arrived."""
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    body = {"model": QWEN, "prompt": "Once upon a time", "max_tokens": 1900, "stream": True,
            "ignore_eos": True, "temperature": 0}
    conn.request("POST", COMPLETIONS, body=json.dumps(body),
                 headers={"Content-Type": "application/json", "Idempotency-Key": key})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    assert resp.readline().startswith(b"data: "), "the stream's first event"
    return conn, resp, body


def test_a_retry_while_the_first_runs_is_409_and_a_broken_stream_is_not_kept(qwen):
    key = new_key()
    conn, _resp, body = _open_stream(qwen.http, key)
    try:
        err = error_of(post(qwen.http, COMPLETIONS, body, key), 409)
        assert (err["type"], err["code"]) == ("invalid_request_error", "idempotency_key_in_use")
    finally:
        conn.close()
    # The client went away mid-stream: nothing was stored, the key is free
    # again and a request with another body runs afresh under it (until the
    # shim has seen the stream go, the key is held: 422 for another body).
    deadline = time.monotonic() + WAIT_S
    while True:
        again = post(qwen.http, COMPLETIONS, {**body, "max_tokens": 2}, key)
        if again.status not in (409, 422) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert again.status == 200 and not replayed(again), (again.status, again.body[:300])


def test_a_409_carries_retry_after(qwen):
    key = new_key()
    conn, _resp, body = _open_stream(qwen.http, key)
    try:
        reply = post(qwen.http, COMPLETIONS, body, key)
        assert reply.status == 409 and reply.headers.get("retry-after") == "1", reply.headers
    finally:
        conn.close()


def test_a_streamed_retry_replays_the_same_events(qwen):
    key = new_key()
    body = {**BODIES[CHAT], "stream": True, "stream_options": {"include_usage": True}}
    first = harness.http_sse(qwen.http, CHAT, body, headers={"Idempotency-Key": key})
    assert first.status == 200 and first.done and "idempotent-replayed" not in first.headers
    again = harness.http_sse(qwen.http, CHAT, body, headers={"Idempotency-Key": key})
    assert again.headers.get("idempotent-replayed") == "true"
    assert again.headers["content-type"].startswith("text/event-stream")
    assert again.raw == first.raw and again.done
    assert {c["id"] for c in again.chunks()} == {c["id"] for c in first.chunks()}


def test_a_failed_first_attempt_is_not_stored(qwen):
    key = new_key()
    bad = {**BODIES[CHAT], "temperature": -1}
    assert error_of(post(qwen.http, CHAT, bad, key), 400)["param"] == "temperature"
    again = post(qwen.http, CHAT, bad, key)
    assert again.status == 400 and not replayed(again), "a failure is answered afresh, not replayed"
    # The key is free: the corrected request (another body) runs and is kept.
    fixed = post(qwen.http, CHAT, BODIES[CHAT], key)
    assert fixed.status == 200 and not replayed(fixed)
    assert replayed(post(qwen.http, CHAT, BODIES[CHAT], key))


def test_an_unknown_model_on_embeddings_is_not_stored(qwen):
    key = new_key()
    body = {"model": "no-such-model", "input": "hi"}
    for _ in range(2):
        reply = post(qwen.http, "/v1/embeddings", body, key)
        assert error_of(reply, 404)["code"] == "model_not_found" and not replayed(reply)


def test_keys_are_scoped_by_the_authorization_value(qwen):
    key = new_key()
    alice, bob = {"Authorization": "Bearer alice"}, {"Authorization": "Bearer bob"}
    first = post(qwen.http, COMPLETIONS, BODIES[COMPLETIONS], key, alice)
    assert first.status == 200
    other = post(qwen.http, COMPLETIONS, BODIES[COMPLETIONS], key, bob)
    assert other.status == 200 and not replayed(other) and other.body != first.body
    # Bob's use of the key is his own: another body is no conflict for Alice.
    mine = post(qwen.http, COMPLETIONS, BODIES[COMPLETIONS], key, alice)
    assert replayed(mine) and mine.body == first.body


@pytest.mark.parametrize("value", ["", '""', "k" * 256, "caf\u00e9"], ids=["empty", "empty-string", "too-long", "non-ascii"])
def test_a_malformed_key_is_400(qwen, value):
    host, port = qwen.http.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.putrequest("POST", COMPLETIONS)
        body = json.dumps(BODIES[COMPLETIONS]).encode()
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(body)))
        conn.putheader("Idempotency-Key", value.encode("utf-8"))
        conn.endheaders(body)
        resp = conn.getresponse()
        reply = harness.HttpReply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()
    err = error_of(reply, 400)
    assert (err["type"], err["code"]) == ("invalid_request_error", "invalid_idempotency_key")


def test_the_key_is_ignored_on_other_routes(qwen):
    key = new_key()
    body = {"model": QWEN, "prompt": "hello"}
    first = post(qwen.http, "/tokenize", body, key)
    assert first.status == 200 and not replayed(post(qwen.http, "/tokenize", body, key))


def test_keys_expire_after_the_ttl(module_server):
    server = module_server(QWEN, "--idempotency-ttl-secs", "2")
    key = new_key()
    first = post(server.http, COMPLETIONS, BODIES[COMPLETIONS], key)
    assert first.status == 200
    assert replayed(post(server.http, COMPLETIONS, BODIES[COMPLETIONS], key))
    # Another body under the key is 422 until the key expires, then it runs.
    deadline = time.monotonic() + WAIT_S
    while (again := post(server.http, COMPLETIONS, {**BODIES[COMPLETIONS], "max_tokens": 3}, key)).status == 422:
        assert time.monotonic() < deadline, "the key did not expire"
        time.sleep(0.2)
    assert again.status == 200 and not replayed(again)


def test_the_oldest_stored_key_makes_room(module_server):
    server = module_server(QWEN, "--idempotency-max-keys", "2")
    keys = [new_key() for _ in range(3)]
    firsts = [post(server.http, COMPLETIONS, BODIES[COMPLETIONS], k) for k in keys]
    assert all(r.status == 200 for r in firsts)
    newest = post(server.http, COMPLETIONS, BODIES[COMPLETIONS], keys[2])
    assert replayed(newest) and newest.body == firsts[2].body
    oldest = post(server.http, COMPLETIONS, BODIES[COMPLETIONS], keys[0])
    assert oldest.status == 200 and not replayed(oldest) and oldest.body != firsts[0].body
