"""Long, quiet streams stay alive.

A streamed HTTP response that has no event for `--sse-heartbeat-secs` gets
an SSE comment, `: keep-alive`, so proxies do not cut a stream that looks
idle. Here the heartbeat is 1 s and the request stalls in the queue behind
a generation that holds the engine's only running slot: the response starts
(a stream waits for its first token no longer than one heartbeat before
sending its headers), the comment arrives while it waits, and once the slot
frees the stream completes as usual (every token, the usage, `[DONE]`). The same server PINGs each HTTP/2
connection every second on both sides of the gRPC hop
(`--http2-keepalive-interval`, `--upstream-keepalive-interval`): the
stream's connections survive the pings through the stall.
"""

from __future__ import annotations

import http.client
import json
import sys

import grpc
import pytest

import harness
from conftest import QWEN, assert_no_panic

sys.path.insert(0, str(harness.REPO / "clients" / "python"))
from gyre.v1 import generate_pb2 as pb  # noqa: E402
from gyre.v1 import generate_pb2_grpc as pb_grpc  # noqa: E402

HEARTBEAT = b": keep-alive"


def carries_text(line: bytes) -> bool:
    if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
        return False
    chunk = json.loads(line[5:])
    return any(c.get("text") or (c.get("delta") or {}).get("content") for c in chunk.get("choices", []))


def wait_for(stub, predicate) -> pb.EngineStats:
    for _ in range(100_000):
        stats = stub.GetStats(pb.GetStatsRequest(model=QWEN))
        if predicate(stats):
            return stats
    raise AssertionError(f"the engine never reached the state: {stats}")


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_stalled_stream_gets_heartbeats_and_still_completes(module_server, path):
    server = module_server(QWEN, "--max-running", "1", "--sse-heartbeat-secs", "1",
                          "--http2-keepalive-interval", "1", "--upstream-keepalive-interval", "1",
                          "--upstream-keepalive-timeout", "5")
    channel = grpc.insecure_channel(server.grpc)
    stub = pb_grpc.GenerationStub(channel)
    # A generation as long as the context allows holds the only slot.
    blocker = stub.GenerateStream(pb.Request(model=QWEN, text="Story:", ignore_eos=True))
    conn = None
    try:
        wait_for(stub, lambda s: s.running == 1)
        body = {"model": QWEN, "max_tokens": 5, "ignore_eos": True, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}}
        body.update({"messages": [{"role": "user", "content": "Hi"}]} if "chat" in path
                    else {"prompt": "Hi"})
        host, port = server.http.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()[:500]
        lines = iter(resp.readline, b"")
        before = []
        for line in lines:
            if line.rstrip(b"\r\n") == HEARTBEAT:
                break
            before.append(line)
        else:
            pytest.fail(f"the stream ended without a heartbeat: {before}")
        # Still queued behind the blocker: no token was sent before it.
        assert not any(carries_text(line) for line in before), before
        assert wait_for(stub, lambda s: True).waiting == 1

        blocker.cancel()
        raw = b"".join(before) + HEARTBEAT + b"\n" + b"".join(lines)
    finally:
        blocker.cancel()
        channel.close()
        if conn is not None:
            conn.close()
    events = harness.parse_sse(raw)
    assert events[-1] == "[DONE]", raw[-500:]
    chunks = [json.loads(e) for e in events[:-1]]
    assert all("error" not in c for c in chunks), chunks
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert usage and usage[-1]["completion_tokens"] == 5, chunks
    assert server.alive()
    assert_no_panic(server)
