"""Stored responses and conversations belong to the tenant that made them.

With a keys file of two tenants, one tenant's response and conversation ids
read as unknown to the other on every route that takes them (404, the same
answer as an id that never existed, so ids do not leak), over HTTP through
the shim and over gRPC: retrieve, input items, delete, continuing it with
`previous_response_id`, and a conversation's retrieve, items, delete and
use in a new response. The owner keeps full access.
"""

from __future__ import annotations

import sys

import grpc
import pytest

import harness
from conftest import QWEN
from test_tenants import key_hash  # noqa: F401  (keys_file uses it)
from test_tenants import keys_file

sys.path.insert(0, str(harness.REPO / "clients" / "python"))
from gyre.v1 import responses_pb2 as rpb  # noqa: E402
from gyre.v1 import responses_pb2_grpc as rpb_grpc  # noqa: E402

KEYS = {"key-alice": "alice", "key-bob": "bob"}


@pytest.fixture(scope="module")
def server(tmp_path_factory, module_server) -> harness.Server:
    path = tmp_path_factory.mktemp("keys") / "keys.toml"
    path.write_text(keys_file({"alice": {}, "bob": {}}, KEYS))
    return module_server(QWEN, "--keys-file", str(path))


def call(server, method: str, path: str, key: str, payload=None) -> harness.HttpReply:
    return harness.http_json(server.http, path, payload, method=method,
                             headers={"Authorization": f"Bearer {key}"})


def create(server, key: str, **extra) -> dict:
    r = call(server, "POST", "/v1/responses", key,
             {"model": QWEN, "input": "Say hello", "max_output_tokens": 4, **extra})
    assert r.status == 200, r.body
    return r.json()


def assert_unknown(reply: harness.HttpReply):
    assert reply.status == 404, (reply.status, reply.body)
    assert reply.json()["error"]["type"] == "invalid_request_error", reply.body


def test_another_tenants_response_is_unknown_over_http(server):
    mine = create(server, "key-alice")
    rid = mine["id"]
    assert_unknown(call(server, "GET", f"/v1/responses/{rid}", "key-bob"))
    assert_unknown(call(server, "GET", f"/v1/responses/{rid}/input_items", "key-bob"))
    assert_unknown(call(server, "DELETE", f"/v1/responses/{rid}", "key-bob"))
    r = call(server, "POST", "/v1/responses", "key-bob",
             {"model": QWEN, "input": "Go on", "max_output_tokens": 4, "previous_response_id": rid})
    assert_unknown(r)
    assert r.json()["error"]["param"] == "previous_response_id", r.body
    # The owner still has it all (bob's delete did nothing).
    assert call(server, "GET", f"/v1/responses/{rid}", "key-alice").json()["id"] == rid
    assert call(server, "GET", f"/v1/responses/{rid}/input_items", "key-alice").status == 200
    create(server, "key-alice", previous_response_id=rid)
    assert call(server, "DELETE", f"/v1/responses/{rid}", "key-alice").status == 200


def test_another_tenants_conversation_is_unknown_over_http(server):
    r = call(server, "POST", "/v1/conversations", "key-alice",
             {"items": [{"type": "message", "role": "user", "content": "Hi"}]})
    assert r.status == 200, r.body
    cid = r.json()["id"]
    assert_unknown(call(server, "GET", f"/v1/conversations/{cid}", "key-bob"))
    assert_unknown(call(server, "GET", f"/v1/conversations/{cid}/items", "key-bob"))
    assert_unknown(call(server, "DELETE", f"/v1/conversations/{cid}", "key-bob"))
    assert_unknown(call(server, "POST", "/v1/responses", "key-bob",
                        {"model": QWEN, "input": "Hi", "max_output_tokens": 4, "conversation": cid}))
    assert call(server, "GET", f"/v1/conversations/{cid}", "key-alice").json()["id"] == cid
    create(server, "key-alice", conversation=cid)
    assert call(server, "DELETE", f"/v1/conversations/{cid}", "key-alice").status == 200


def test_another_tenants_response_is_not_found_over_grpc(server):
    rid = create(server, "key-alice")["id"]
    with grpc.insecure_channel(server.grpc) as ch:
        stub = rpb_grpc.ResponsesStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            stub.Get(rpb.GetResponseRequest(response_id=rid),
                     metadata=[("authorization", "Bearer key-bob")], timeout=60)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND, e.value
        with pytest.raises(grpc.RpcError) as e:
            stub.Delete(rpb.DeleteResponseRequest(response_id=rid),
                        metadata=[("authorization", "Bearer key-bob")], timeout=60)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND, e.value
        got = stub.Get(rpb.GetResponseRequest(response_id=rid),
                       metadata=[("authorization", "Bearer key-alice")], timeout=60)
        assert got.id == rid
