"""Request ids: `X-Request-Id` (or `X-Request-Trace`) taken from the client
or generated (a UUID), returned on every HTTP response, errors included,
refused with a 400 in OpenAI's error shape when malformed; on gRPC, the
`x-request-id` metadata taken or generated and returned in the response
metadata."""

from __future__ import annotations

import sys
import uuid

import grpc

import harness
from conftest import QWEN

sys.path.insert(0, str(harness.REPO / "clients" / "python"))
from gyre.v1 import generate_pb2 as pb  # noqa: E402
from gyre.v1 import generate_pb2_grpc as pb_grpc  # noqa: E402

CHAT = {"model": QWEN, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def test_a_client_request_id_is_returned(qwen):
    reply = harness.http_json(qwen.http, "/v1/chat/completions", CHAT, headers={"X-Request-Id": "client-id-42"})
    assert reply.status == 200, reply.body
    assert reply.headers["x-request-id"] == "client-id-42"
    # The request id is not the completion's id.
    assert reply.json()["id"] != "client-id-42"


def test_without_one_a_uuid_is_generated_per_request(qwen):
    ids = []
    for _ in range(2):
        reply = harness.http_json(qwen.http, "/v1/chat/completions", CHAT)
        assert reply.status == 200, reply.body
        ids.append(reply.headers["x-request-id"])
        assert str(uuid.UUID(ids[-1])) == ids[-1]
    assert ids[0] != ids[1]


def test_a_streamed_response_carries_it(qwen):
    reply = harness.http_sse(qwen.http, "/v1/chat/completions", {**CHAT, "stream": True},
                             headers={"X-Request-Id": "stream-id"})
    assert reply.status == 200 and reply.done
    assert reply.headers["x-request-id"] == "stream-id"


def test_x_request_trace_is_accepted_and_echoed(qwen):
    reply = harness.http_json(qwen.http, "/v1/chat/completions", CHAT, headers={"X-Request-Trace": "gw-7"})
    assert reply.status == 200, reply.body
    assert reply.headers["x-request-id"] == "gw-7"
    assert reply.headers["x-request-trace"] == "gw-7"


def test_errors_carry_the_request_id(qwen):
    missing = harness.http_json(qwen.http, "/v1/nowhere", headers={"X-Request-Id": "err-1"})
    assert missing.status == 404 and missing.headers["x-request-id"] == "err-1"
    bad = harness.http_json(qwen.http, "/v1/chat/completions", {**CHAT, "model": "no-such"},
                            headers={"X-Request-Id": "err-2"})
    assert bad.status == 404 and bad.headers["x-request-id"] == "err-2"
    assert bad.json()["error"]["code"] == "model_not_found"


def test_a_malformed_request_id_is_a_400(qwen):
    for given in ["x" * 129, "has space"]:
        reply = harness.http_json(qwen.http, "/v1/chat/completions", CHAT, headers={"X-Request-Id": given})
        assert reply.status == 400, reply.body
        assert reply.json() == {"error": {
            "message": "X-Request-Id must be 1 to 128 visible ASCII characters",
            "type": "invalid_request_error", "param": "X-Request-Id", "code": "invalid_request_id"}}
        # The answer still has an id of its own (a fresh one).
        assert str(uuid.UUID(reply.headers["x-request-id"])) == reply.headers["x-request-id"]


def test_grpc_takes_or_generates_the_request_id(qwen):
    with grpc.insecure_channel(qwen.grpc) as channel:
        stub = pb_grpc.GenerationStub(channel)
        req = pb.Request(model=QWEN, text="Hello", max_tokens=2)
        given = stub.GenerateStream(req, metadata=[("x-request-id", "grpc-given")])
        list(given)
        assert dict(given.initial_metadata())["x-request-id"] == "grpc-given"
        fresh = stub.GenerateStream(req)
        list(fresh)
        made = dict(fresh.initial_metadata())["x-request-id"]
        assert str(uuid.UUID(made)) == made
        # A refused call returns it too (in the trailers).
        try:
            list(stub.GenerateStream(pb.Request(model="no-such", text="Hi"),
                                     metadata=[("x-request-id", "grpc-refused")]))
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.NOT_FOUND
            assert dict(e.trailing_metadata())["x-request-id"] == "grpc-refused"
        else:
            raise AssertionError("an unknown model was accepted")
