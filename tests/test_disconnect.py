"""A client that disconnects mid-stream cancels its generation.

A streaming request asks for nearly the whole context (ignore_eos), reads a
few chunks and closes the socket. The engine's own counters (gRPC GetStats)
then show the request gone and far fewer tokens generated than requested:
an uncancelled request would have generated all of them. This holds however
fast the machine is. Afterwards the server must still be healthy, answer a
follow-up request, and not have panicked.

Runs against its own server so no other test's work disturbs the measurement.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import time

import pytest

import harness
from conftest import QWEN, assert_no_panic

MAX_TOKENS = 2000  # the context is 2048 tokens
MIN_CHUNKS = 20  # read this many events before leaving


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(QWEN)


def open_stream(address: str, path: str, body: dict) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()[:500]
    return conn, resp


def read_events(lines, is_event) -> int:
    """Reads MIN_CHUNKS events from `lines`; returns how many were read."""
    n = 0
    for line in lines:
        if is_event(line):
            n += 1
            if n >= MIN_CHUNKS:
                return n
    pytest.fail(f"the stream ended after {n} events, before the client left")


def stats(server: harness.Server) -> dict:
    [s] = harness.buf_curl(server.grpc, "gyre.v1.Generation/GetStats", {}).ok().messages
    return s


def generated(s: dict) -> int:
    return int(s.get("generatedTokensTotal", 0))


def assert_cancelled(server: harness.Server, before: dict, read: int) -> None:
    """The engine drained, and the abandoned request stopped far short of MAX_TOKENS."""
    deadline = time.monotonic() + 120
    while True:
        s = stats(server)
        if int(s.get("running", 0)) == 0 and int(s.get("waiting", 0)) == 0:
            break
        assert time.monotonic() < deadline, f"requests still running long after the client left: {s}"
    made = generated(s) - generated(before)
    assert read - 1 <= made < MAX_TOKENS // 2, (
        f"{made} tokens were generated for a client that left after {read} events "
        f"(uncancelled: {MAX_TOKENS})"
    )
    assert int(s.get("kvBlocksUsed", 0)) == 0, s


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_disconnect_cancels_generation(server, path):
    before = stats(server)
    body = {"model": QWEN, "max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0, "stream": True}
    body.update({"messages": [{"role": "user", "content": "Go on forever."}]} if "chat" in path else {"prompt": "Go"})
    conn, resp = open_stream(server.http, path, body)
    n = read_events(iter(resp.readline, b""), lambda line: line.startswith(b"data:"))
    conn.sock.shutdown(socket.SHUT_RDWR)
    resp.close()
    conn.close()
    assert_cancelled(server, before, n)

    # Still healthy, and it serves the next request.
    health = harness.buf_curl(server.grpc, "grpc.health.v1.Health/Check", {}).ok()
    assert health.messages == [{"status": "SERVING"}]
    follow = harness.http_json(server.http, "/v1/completions",
                               {"model": QWEN, "prompt": "Hi", "max_tokens": 4, "temperature": 0})
    assert follow.status == 200, follow.body
    assert follow.json()["usage"]["completion_tokens"] == 4
    assert server.alive()
    assert_no_panic(server)


def test_grpc_stream_dropped_cancels_generation(server):
    """Killing a `buf curl` GenerateStream client mid-stream also stops the work."""
    before = stats(server)
    req = {"model": QWEN, "text": "Go", "maxTokens": MAX_TOKENS, "ignoreEos": True}
    argv = [str(harness.BUF), "curl", "--protocol", "grpc", "--http2-prior-knowledge", "-d", json.dumps(req),
            f"http://{server.grpc}/gyre.v1.Generation/GenerateStream"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    try:
        n = read_events(proc.stdout, lambda line: '"delta"' in line)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    assert_cancelled(server, before, n)
    follow = harness.buf_curl(server.grpc, "gyre.v1.Generation/GenerateStream",
                              {"model": QWEN, "text": "Hi", "maxTokens": 3, "ignoreEos": True}).ok()
    assert follow.messages[-1]["finish"]["usage"]["completionTokens"] == 3
    assert_no_panic(server)
