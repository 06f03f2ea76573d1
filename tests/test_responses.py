"""The Responses API over HTTP (`/v1/responses`, `/v1/conversations`) against
a real `gyre serve` of tiny-qwen2: raw HTTP validated against OpenAI's
`Response` / `ResponseStreamEvent` schemas (see responses_util.py for the
stream invariants), the official SDK's `responses.create`, `.stream`,
`.retrieve`, `.delete` and `.input_items.list`, replays, background runs
polled and cancelled, conversations, and 404s for unknown ids.
"""

from __future__ import annotations

import http.client
import json

import openai
import pytest

import harness
import openai_schema as spec
import responses_util as ru
from conftest import QWEN

BODY = {"model": QWEN, "input": "Name a colour.", "temperature": 0, "max_output_tokens": 8}
COLOURS = ["red", "green", "blue"]
COLOUR_FORMAT = {"type": "json_schema", "name": "colour", "strict": True, "schema": {
    "type": "object", "properties": {"colour": {"enum": COLOURS}}, "required": ["colour"],
    "additionalProperties": False}}
#: tiny-qwen2's end-of-sequence tokens, banned so that a generation runs on.
NO_EOS = {"151645": -100, "151643": -100}


def test_create_matches_the_schema(qwen):
    r = ru.create(qwen.http, BODY)
    assert r["object"] == "response"
    assert r["id"].startswith("resp_")
    assert r["status"] in ("completed", "incomplete")
    assert r["model"] == QWEN
    assert r["store"] is True and r["background"] is False
    assert r["max_output_tokens"] == 8 and r["temperature"] == 0
    [message] = r["output"]
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["content"][0]["annotations"] == []
    assert r["output_text"] == message["content"][0]["text"]
    usage = r["usage"]
    assert 0 < usage["output_tokens"] <= 8
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    if r["status"] == "incomplete":
        assert r["incomplete_details"] == {"reason": "max_output_tokens"}


def test_stream_matches_the_schema_and_the_final_object(qwen):
    events = ru.stream(qwen.http, BODY)
    types = [e["type"] for e in events]
    assert types[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert types[-4:-1] == ["response.output_text.done", "response.content_part.done",
                            "response.output_item.done"]
    final = events[-1]["response"]
    # The stored response is the streamed one.
    stored = ru.ok(harness.http_request(qwen.http, "GET", f"/v1/responses/{final['id']}"))
    spec.validate(ru.RESPONSE, stored)
    assert stored["output"] == final["output"]
    assert stored["status"] == final["status"]


def test_the_same_request_gives_the_same_text_streamed_or_not(qwen):
    plain = ru.create(qwen.http, BODY)
    streamed = ru.stream(qwen.http, BODY)[-1]["response"]
    assert plain["output_text"] == streamed["output_text"]
    assert plain["id"] != streamed["id"]


def test_logprobs_when_included(qwen):
    body = {**BODY, "top_logprobs": 2, "include": ["message.output_text.logprobs"]}
    r = ru.create(qwen.http, body)
    part = r["output"][0]["content"][0]
    assert 0 < len(part["logprobs"]) <= r["usage"]["output_tokens"]
    for lp in part["logprobs"]:
        assert lp["logprob"] <= 0 and len(lp["top_logprobs"]) == 2
    events = ru.stream(qwen.http, body)
    streamed = [lp for e in events if e["type"] == "response.output_text.delta" for lp in e["logprobs"]]
    assert [lp["token"] for lp in streamed] == [lp["token"] for lp in part["logprobs"]]


def test_sdk_create_stream_retrieve_delete(client):
    # A JSON schema makes the random-weight model end (the SDK's stream
    # helper wants a `response.completed`).
    kwargs = dict(model=QWEN, input=[{"role": "user", "content": "Name a colour."}],
                  temperature=0, max_output_tokens=64, text={"format": COLOUR_FORMAT})
    r = client.responses.create(**kwargs)
    assert r.status == "completed" and json.loads(r.output_text)["colour"] in COLOURS

    deltas, final = [], None
    for event in client.responses.create(**kwargs, stream=True):
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        if event.type in ru.TERMINAL:
            final = event.response
    assert final is not None and "".join(deltas) == final.output_text == r.output_text

    added = []
    with client.responses.stream(**kwargs) as stream:
        for event in stream:
            if event.type == "response.output_item.added":
                added.append(event.item.id)
        accumulated = stream.get_final_response()
    assert accumulated.output_text == r.output_text
    assert [item.id for item in accumulated.output] == added

    fetched = client.responses.retrieve(r.id)
    assert (fetched.id, fetched.output_text) == (r.id, r.output_text)
    items = client.responses.input_items.list(r.id)
    assert [i.type for i in items.data] == ["message"]
    assert items.data[0].content[0].text == "Name a colour."
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_input_items_paginate(qwen):
    conversation = [{"role": "user", "content": f"message {i}"} for i in range(5)]
    r = ru.create(qwen.http, {**BODY, "input": conversation})
    path = f"/v1/responses/{r['id']}/input_items"
    listing = ru.ok(harness.http_request(qwen.http, "GET", f"{path}?order=asc&limit=2"))
    spec.validate(ru.ITEM_LIST, listing)
    assert [i["content"][0]["text"] for i in listing["data"]] == ["message 0", "message 1"]
    assert listing["has_more"] is True
    after = listing["last_id"]
    rest = ru.ok(harness.http_request(qwen.http, "GET", f"{path}?order=asc&after={after}&limit=10"))
    assert [i["content"][0]["text"] for i in rest["data"]] == ["message 2", "message 3", "message 4"]
    assert rest["has_more"] is False
    newest = ru.ok(harness.http_request(qwen.http, "GET", f"{path}?limit=1"))
    assert newest["data"][0]["content"][0]["text"] == "message 4"


def test_replay_after_a_sequence_number(qwen):
    events = ru.stream(qwen.http, BODY)
    rid = events[-1]["response"]["id"]
    whole = ru.events_of(harness.http_request(qwen.http, "GET", f"/v1/responses/{rid}?stream=true"))
    assert whole == events
    tail = ru.events_of(harness.http_request(
        qwen.http, "GET", f"/v1/responses/{rid}?stream=true&starting_after=3"))
    assert tail == events[4:]
    ru.check_stream(tail, first_seq=4)


def test_input_tokens_count_the_rendered_input(qwen):
    body = {**BODY, "instructions": "Be brief."}
    counted = ru.ok(ru.post(qwen.http, "/v1/responses/input_tokens", body))
    assert counted["object"] == "response.input_tokens"
    assert counted["input_tokens"] == ru.create(qwen.http, body)["usage"]["input_tokens"]


def test_store_false_keeps_nothing(qwen):
    r = ru.create(qwen.http, {**BODY, "store": False})
    assert r["store"] is False
    reply = harness.http_request(qwen.http, "GET", f"/v1/responses/{r['id']}")
    assert reply.status == 404, reply.body


@pytest.mark.parametrize("method,path,param", [
    ("GET", "/v1/responses/resp_unknown", None),
    ("GET", "/v1/responses/resp_unknown?stream=true", None),
    ("DELETE", "/v1/responses/resp_unknown", None),
    ("POST", "/v1/responses/resp_unknown/cancel", None),
    ("GET", "/v1/responses/resp_unknown/input_items", None),
    ("GET", "/v1/conversations/conv_unknown", None),
    ("DELETE", "/v1/conversations/conv_unknown", None),
    ("GET", "/v1/conversations/conv_unknown/items", None),
    ("POST", "/v1/responses", "previous_response_id"),
    ("POST", "/v1/responses", "conversation"),
])
def test_unknown_ids_are_404(qwen, method, path, param):
    body = None
    if method == "POST" and param:
        body = json.dumps({**BODY, param: "resp_unknown" if param == "previous_response_id" else "conv_unknown"})
    elif method == "POST":
        body = "{}"
    reply = harness.http_request(qwen.http, method, path, body)
    assert reply.status == 404, reply.body
    spec.validate(spec.ERROR, reply.json())
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "not_found", error
    if param:
        assert error["param"] == param


def test_background_is_pollable_and_cancellable(qwen):
    body = {**BODY, "background": True, "max_output_tokens": 1900, "logit_bias": NO_EOS}
    queued = ru.create(qwen.http, body)
    assert queued["status"] in ("queued", "in_progress") and queued["background"] is True
    rid = queued["id"]
    # Watch it run: replay its events until the first text arrives.
    host, port = qwen.http.rsplit(":", 1)
    live = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        live.request("GET", f"/v1/responses/{rid}?stream=true")
        reply = live.getresponse()
        assert reply.status == 200
        while not reply.readline().startswith(b"event: response.output_text.delta"):
            pass
    finally:
        live.close()
    polled = ru.ok(harness.http_request(qwen.http, "GET", f"/v1/responses/{rid}"))
    assert polled["status"] == "in_progress"
    cancelled = ru.ok(ru.post(qwen.http, f"/v1/responses/{rid}/cancel", {}))
    spec.validate(ru.RESPONSE, cancelled)
    assert cancelled["status"] == "cancelled"
    after = ru.ok(harness.http_request(qwen.http, "GET", f"/v1/responses/{rid}"))
    assert after["status"] == "cancelled"
    # Cancelling again returns it unchanged.
    again = ru.ok(ru.post(qwen.http, f"/v1/responses/{rid}/cancel", {}))
    assert again["status"] == "cancelled"


def test_background_replay_streams_to_the_end(qwen):
    queued = ru.create(qwen.http, {**BODY, "background": True})
    events = ru.events_of(harness.http_request(
        qwen.http, "GET", f"/v1/responses/{queued['id']}?stream=true"))
    assert events[0]["type"] == "response.created"
    assert events[0]["response"]["status"] == "queued"
    assert events[1]["type"] == "response.queued"
    ru.check_stream(events)


def test_cancel_needs_background(qwen):
    r = ru.create(qwen.http, BODY)
    reply = ru.post(qwen.http, f"/v1/responses/{r['id']}/cancel", {})
    # FAILED_PRECONDITION, as every such status maps (OpenAI answers 400).
    assert reply.status == 422, reply.body
    spec.validate(spec.ERROR, reply.json())


def test_conversation_collects_the_turns(qwen):
    conv = ru.ok(ru.post(qwen.http, "/v1/conversations", {
        "items": [{"type": "message", "role": "system", "content": "Be brief."}],
        "metadata": {"topic": "colours"},
    }))
    assert conv["object"] == "conversation" and conv["id"].startswith("conv_")
    assert conv["metadata"] == {"topic": "colours"}
    first = ru.create(qwen.http, {**BODY, "conversation": conv["id"]})
    assert first["conversation"] == {"id": conv["id"]}
    second = ru.create(qwen.http, {**BODY, "input": "And another?", "conversation": {"id": conv["id"]}})
    # The second turn saw the first: its input is longer by at least the turn.
    assert second["usage"]["input_tokens"] > first["usage"]["input_tokens"]
    items = ru.ok(harness.http_request(qwen.http, "GET", f"/v1/conversations/{conv['id']}/items?order=asc"))
    spec.validate("ConversationItemList", items)
    texts = [(i["role"], i["content"][0]["text"]) for i in items["data"]]
    assert texts == [("system", "Be brief."), ("user", "Name a colour."),
                     ("assistant", first["output_text"]), ("user", "And another?"),
                     ("assistant", second["output_text"])]
    fetched = ru.ok(harness.http_request(qwen.http, "GET", f"/v1/conversations/{conv['id']}"))
    assert fetched == conv
    deleted = ru.ok(harness.http_request(qwen.http, "DELETE", f"/v1/conversations/{conv['id']}"))
    assert deleted == {"id": conv["id"], "object": "conversation.deleted", "deleted": True}


def test_items_already_stored_are_refused_and_pages_list_each_item_once(qwen):
    # Re-sending a response's output as input, where the conversation or the
    # chain already holds it, is OpenAI's "Duplicate item found" 400: item
    # lists page by id, and a repeated id made `after` pages repeat forever.
    conv = ru.ok(ru.post(qwen.http, "/v1/conversations", {}))
    first = ru.create(qwen.http, {**BODY, "conversation": conv["id"]})
    again = [*first["output"], {"role": "user", "content": "more"}]
    for ref in ({"conversation": conv["id"]}, {"previous_response_id": first["id"]}):
        reply = ru.post(qwen.http, "/v1/responses", {**BODY, **ref, "input": again})
        assert reply.status == 400, reply.body[:300]
        assert reply.json()["error"]["param"] == "input[0].id"
        assert "duplicate item" in reply.json()["error"]["message"]
    reply = ru.post(qwen.http, "/v1/conversations", {"items": [
        {"type": "message", "id": "msg_d", "role": "user", "content": c} for c in "ab"]})
    assert reply.status == 400 and reply.json()["error"]["param"] == "items[1].id", reply.body[:300]
    ru.create(qwen.http, {**BODY, "input": "Another?", "conversation": conv["id"]})
    want = ru.ok(harness.http_request(qwen.http, "GET", f"/v1/conversations/{conv['id']}/items?order=asc"))["data"]
    assert len(want) >= 4
    # An empty cursor is none (it was an unknown item, a 400).
    empty = ru.ok(harness.http_request(qwen.http, "GET", f"/v1/conversations/{conv['id']}/items?order=asc&after="))
    assert empty["data"] == want
    for order, expect in (("asc", want), ("desc", want[::-1])):
        seen, after = [], ""
        while True:
            page = ru.ok(harness.http_request(
                qwen.http, "GET", f"/v1/conversations/{conv['id']}/items?order={order}&limit=1{after}"))
            seen += [i["id"] for i in page["data"]]
            assert len(seen) <= len(want), seen
            if not page["has_more"]:
                break
            after = f"&after={page['data'][-1]['id']}"
        assert seen == [i["id"] for i in expect]


def test_previous_response_id_chains(qwen):
    first = ru.create(qwen.http, BODY)
    second = ru.create(qwen.http, {**BODY, "input": "Another?", "previous_response_id": first["id"]})
    assert second["previous_response_id"] == first["id"]
    alone = ru.create(qwen.http, {**BODY, "input": "Another?"})
    assert second["usage"]["input_tokens"] > alone["usage"]["input_tokens"]


def test_paths_without_v1(qwen):
    r = ru.ok(ru.post(qwen.http, "/responses", BODY))
    assert r["object"] == "response"
    fetched = ru.ok(harness.http_request(qwen.http, "GET", f"/responses/{r['id']}"))
    assert fetched["id"] == r["id"]
