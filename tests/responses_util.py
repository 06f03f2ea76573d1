"""Helpers of the Responses API tests: raw HTTP calls, named SSE events and
the checks every Responses stream must pass.

`sse_named` keeps each event's `event:` name beside its JSON so that tests
can check that the name equals the JSON's `type`. `check_stream` validates a
whole stream: every event against OpenAI's `ResponseStreamEvent` schema,
`sequence_number`s 0, 1, 2, ..., `response.created` first and one terminal
event last, no `[DONE]`, the ids of `output_item.added` items equal to those
of the final response, and every text's deltas joined equal to its `done`
text and to the final item's text (output text, reasoning text and function
call arguments alike).
"""

from __future__ import annotations

import json

import harness
import openai_schema as spec

RESPONSE = "Response"
EVENT = "ResponseStreamEvent"
ITEM_LIST = "ResponseItemList"
TERMINAL = ("response.completed", "response.incomplete", "response.failed")


def sse_named(raw: bytes) -> list[tuple[str, str]]:
    """(event name, data) of each SSE event; comments (keep-alives) skipped."""
    events, name, data = [], "", []
    for line in raw.decode("utf-8").splitlines():
        if line == "":
            if data:
                events.append((name, "\n".join(data)))
            name, data = "", []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        events.append((name, "\n".join(data)))
    return events


def post(address: str, path: str, body: dict) -> harness.HttpReply:
    return harness.http_request(address, "POST", path, json.dumps(body))


def ok(reply: harness.HttpReply) -> dict:
    assert reply.status == 200, f"HTTP {reply.status}: {reply.body[:800]!r}"
    assert reply.headers.get("content-type", "").startswith("application/json"), reply.headers
    return reply.json()


def create(address: str, body: dict) -> dict:
    """A non-streamed `POST /v1/responses`, validated."""
    response = ok(post(address, "/v1/responses", body))
    spec.validate(RESPONSE, response)
    return response


def events_of(reply: harness.HttpReply) -> list[dict]:
    """The events of an SSE reply, each with its name checked."""
    assert reply.status == 200, f"HTTP {reply.status}: {reply.body[:800]!r}"
    assert reply.headers.get("content-type", "").startswith("text/event-stream"), reply.headers
    named = sse_named(reply.body)
    assert all(data != "[DONE]" for _, data in named), "the Responses stream has no [DONE]"
    events = []
    for name, data in named:
        event = json.loads(data)
        assert event["type"] == name, (name, event)
        spec.validate(EVENT, event)
        events.append(event)
    return events


def stream(address: str, body: dict) -> list[dict]:
    """A streamed `POST /v1/responses`: its events, checked by `check_stream`."""
    events = events_of(post(address, "/v1/responses", {**body, "stream": True}))
    check_stream(events)
    return events


def texts(response: dict) -> dict[tuple[str, int], str]:
    """(item id, content index) -> text of every output_text part."""
    return {
        (item["id"], j): part["text"]
        for item in response["output"] if item["type"] == "message"
        for j, part in enumerate(item["content"]) if part["type"] == "output_text"
    }


def check_stream(events: list[dict], first_seq: int = 0) -> None:
    """The invariants of a whole Responses stream (see the module docstring);
    for a replay's tail (`first_seq` > 0) those a tail can show: numbering,
    one terminal event last, and item ids of the final response."""
    assert events, "no events"
    assert [e["sequence_number"] for e in events] == list(range(first_seq, first_seq + len(events)))
    if first_seq == 0:
        assert events[0]["type"] == "response.created"
    assert events[-1]["type"] in TERMINAL, events[-1]
    assert not any(e["type"] in TERMINAL for e in events[:-1])
    final = events[-1]["response"]
    spec.validate(RESPONSE, final)
    for e in events:
        if "output_index" in e and "item_id" in e:
            assert final["output"][e["output_index"]]["id"] == e["item_id"], e
    if first_seq > 0:
        return
    added = [e["item"]["id"] for e in events if e["type"] == "response.output_item.added"]
    done = [e["item"]["id"] for e in events if e["type"] == "response.output_item.done"]
    assert added == done == [item["id"] for item in final["output"]]
    deltas: dict[tuple[str, int], str] = {}
    dones: dict[tuple[str, int], str] = {}
    for e in events:
        key = (e.get("item_id"), e.get("content_index"))
        if e["type"] == "response.output_text.delta":
            deltas[key] = deltas.get(key, "") + e["delta"]
        elif e["type"] == "response.output_text.done":
            dones[key] = e["text"]
    assert deltas == {k: v for k, v in dones.items() if v}
    assert dones == texts(final)
    thoughts: dict[tuple[str, int], str] = {}
    thought: dict[tuple[str, int], str] = {}
    for e in events:
        key = (e.get("item_id"), e.get("content_index"))
        if e["type"] == "response.reasoning_text.delta":
            thoughts[key] = thoughts.get(key, "") + e["delta"]
        elif e["type"] == "response.reasoning_text.done":
            thought[key] = e["text"]
    assert thoughts == {k: v for k, v in thought.items() if v}
    assert thought == {
        (item["id"], j): part["text"]
        for item in final["output"] if item["type"] == "reasoning"
        for j, part in enumerate(item["content"])
    }
    args: dict[str, str] = {}
    for e in events:
        if e["type"] == "response.function_call_arguments.delta":
            args[e["item_id"]] = args.get(e["item_id"], "") + e["delta"]
        elif e["type"] == "response.function_call_arguments.done":
            assert args.get(e["item_id"], "") == e["arguments"]
            item = final["output"][e["output_index"]]
            assert (item["name"], item["arguments"]) == (e["name"], e["arguments"])
    assert final["output_text"] == "".join(texts(final).values())
