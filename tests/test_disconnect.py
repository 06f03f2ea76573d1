"""A client that disconnects mid-stream cancels its generation.

A streaming request asks for nearly the whole context (ignore_eos), reads a
few chunks and closes the socket. The server exposes no counter of running
requests, so cancellation is observed from outside: the process's CPU time
(/proc/<pid>/stat) must go flat long before the abandoned generation could
have finished at the measured token rate. Afterwards the server must still be
healthy, answer a follow-up request, and not have panicked.

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
MIN_CHUNKS = 20  # read at least this many events, and for at least
MIN_READ_S = 1.0  # this long, before leaving (to measure the token rate)
IDLE_WINDOW_S = 0.5
IDLE_CPU_FRACTION = 0.2  # below this share of one core counts as idle


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


def read_events(lines, is_event) -> tuple[int, float]:
    """Reads events from `lines` until MIN_CHUNKS and MIN_READ_S are reached;
    returns (events read, events per second after the first one)."""
    n, first = 0, None
    for line in lines:
        if not is_event(line):
            continue
        n += 1
        now = time.monotonic()
        first = first or now
        if n >= MIN_CHUNKS and now - first >= MIN_READ_S:
            return n, (n - 1) / (now - first)
    pytest.fail(f"the stream ended after {n} events, before the client left")


def wait_idle(server: harness.Server, deadline_s: float) -> float | None:
    """Seconds until the process's CPU use drops below the idle threshold, or None."""
    start = time.monotonic()
    while time.monotonic() - start < deadline_s:
        before = server.cpu_seconds()
        time.sleep(IDLE_WINDOW_S)
        if server.cpu_seconds() - before < IDLE_CPU_FRACTION * IDLE_WINDOW_S:
            return time.monotonic() - start
    return None


def assert_goes_idle(server: harness.Server, generated: int, rate: float) -> None:
    """The engine must stop well before the abandoned request could finish.

    Per-token cost only grows with the sequence, so the rate measured at the
    start bounds from below how long the rest would have kept it busy.
    """
    remaining_s = (MAX_TOKENS - generated) / rate
    assert remaining_s > 4, f"generation too fast ({rate:.0f} tok/s) to observe cancellation"
    deadline = min(remaining_s / 2, 15.0)
    idle_after = wait_idle(server, deadline)
    assert idle_after is not None, (
        f"the server kept computing for {deadline:.1f}s after the client left "
        f"(uncancelled it would run >= {remaining_s:.0f}s more at {rate:.0f} tok/s)"
    )


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_disconnect_cancels_generation(server, path):
    assert wait_idle(server, 10) is not None, "the fresh server should be idle before the test"
    body = {"model": QWEN, "max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0, "stream": True}
    body.update({"messages": [{"role": "user", "content": "Go on forever."}]} if "chat" in path else {"prompt": "Go"})
    conn, resp = open_stream(server.http, path, body)
    n, rate = read_events(iter(resp.readline, b""), lambda line: line.startswith(b"data:"))
    conn.sock.shutdown(socket.SHUT_RDWR)
    resp.close()
    conn.close()
    assert_goes_idle(server, n, rate)

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
    assert wait_idle(server, 10) is not None
    req = {"model": QWEN, "text": "Go", "maxTokens": MAX_TOKENS, "ignoreEos": True}
    argv = [str(harness.BUF), "curl", "--protocol", "grpc", "--http2-prior-knowledge", "-d", json.dumps(req),
            f"http://{server.grpc}/gyre.v1.Generation/GenerateStream"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    try:
        n, rate = read_events(proc.stdout, lambda line: '"delta"' in line)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    assert_goes_idle(server, n, rate)
    follow = harness.buf_curl(server.grpc, "gyre.v1.Generation/GenerateStream",
                              {"model": QWEN, "text": "Hi", "maxTokens": 3, "ignoreEos": True}).ok()
    assert follow.messages[-1]["finish"]["usage"]["completionTokens"] == 3
    assert_no_panic(server)
