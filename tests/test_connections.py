"""Connection timeouts and limits on both ports (`gyre_shim::conn`).

Servers run with 1-2 s timeouts; each test waits up to 15 s for the effect
(a connection closed, a 408) and never asserts a duration. Raw sockets and
hand-built HTTP/2 frames, so that a test can be the slow or silent client.
"""

from __future__ import annotations

import json
import queue
import socket
import sys
import threading
import time

import grpc
import pytest

import harness
from conftest import QWEN, assert_no_panic
from conn_util import (
    WAIT_S, H2, Closed, connect, get, grpc_headers, json_body, json_headers, read_response, wait_closed,
)

sys.path.insert(0, str(harness.REPO / "clients" / "python"))
from gyre.v1 import generate_pb2 as pb  # noqa: E402
from gyre.v1 import generate_pb2_grpc as pb_grpc  # noqa: E402

TIMEOUTS = ["--header-read-timeout", "1", "--idle-timeout", "2",
            "--http2-keepalive-interval", "1", "--http2-keepalive-timeout", "1"]


def _stopped(server: harness.Server):
    yield server
    server.stop()
    try:
        assert_no_panic(server)
    finally:
        server.remove_log()


@pytest.fixture(scope="module")
def http_server():
    """`gyre serve` with short timeouts (a 1 s body timeout too)."""
    yield from _stopped(harness.serve(QWEN, *TIMEOUTS, "--body-timeout", "1"))


@pytest.fixture(scope="module")
def grpc_server():
    """`gyre grpc` with short timeouts."""
    yield from _stopped(harness.Server.start(
        [str(harness.GYRE_BIN), "grpc", "--model", str(harness.model_dir(QWEN)), "--grpc-addr", "127.0.0.1:0",
         *TIMEOUTS], want=("gRPC",)))


@pytest.fixture(scope="module")
def limited():
    """`gyre serve` allowing 2 connections per port (the shim's pool: 1); a
    header-read timeout longer than the tests wait, so that only the limit
    can close a silent connection."""
    yield from _stopped(harness.serve(QWEN, "--max-connections", "2", "--upstream-connections", "1",
                                      "--header-read-timeout", "60"))


# ---------------------------------------------------------------------------
# HTTP port


def test_http_half_sent_head_is_closed(http_server):
    sock = connect(http_server.http)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: gyre\r\nContent-Type: appl")
    assert b"HTTP/1.1 200" not in wait_closed(sock)


def test_http_idle_keep_alive_connection_is_closed(http_server):
    sock = connect(http_server.http)
    status, headers, _ = get(sock, "/version")
    assert status == 200 and headers.get("connection") != "close"
    assert get(sock, "/version")[0] == 200  # kept alive between requests
    wait_closed(sock)


def test_http_next_head_half_sent_is_closed(http_server):
    """A kept-alive connection that starts a request head must finish it."""
    sock = connect(http_server.http)
    assert get(sock, "/version")[0] == 200
    sock.sendall(b"GET /version HTTP/1.1\r\nHo")
    assert b"HTTP/1.1" not in wait_closed(sock)


def test_http_slow_body_gets_408_and_the_connection_closes(http_server):
    sock = connect(http_server.http)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: gyre\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n{\"model\": ")
    status, headers, body = read_response(sock)
    assert status == 408, body
    assert headers.get("connection") == "close"
    error = json.loads(body)["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "request_timeout")
    assert set(error) == {"message", "type", "param", "code"}
    wait_closed(sock)


def test_http_stream_outlives_the_idle_timeout(http_server):
    """A request in flight keeps its connection: the client stops reading a
    large stream for longer than the idle timeout (the server is blocked on
    the full socket, nothing moves), then reads the rest, all of it."""
    payload = {"model": QWEN, "messages": [{"role": "user", "content": "Tell me a story."}],
               "max_tokens": 400, "temperature": 0, "ignore_eos": True, "logprobs": True, "top_logprobs": 20}
    whole = harness.http_json(http_server.http, "/v1/chat/completions", payload)
    assert whole.status == 200, whole.body
    expected = whole.json()["choices"][0]["message"]["content"]

    host, port = http_server.http.rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(WAIT_S)
    sock.connect((host, int(port)))
    body = json_body({**payload, "stream": True})
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gyre\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    raw = sock.recv(2048)
    assert raw.startswith(b"HTTP/1.1 200"), raw
    time.sleep(3 * 2 + 1)  # past the idle timeout (2 s) and the close grace, with room
    raw += _read_chunked_to_end(sock)
    sock.close()
    # The premise: far more than the socket buffers hold, so the server was
    # mid-response, not done, while the client paused.
    assert len(raw) > 256 * 1024, len(raw)
    events = harness.parse_sse(_dechunk(raw.split(b"\r\n\r\n", 1)[1]))
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == expected
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]] \
        == ["length"]


def _read_chunked_to_end(sock: socket.socket) -> bytes:
    """Reads a chunked body until its last chunk."""
    data = b""
    while not data.endswith(b"\r\n0\r\n\r\n"):
        chunk = sock.recv(65536)
        if not chunk:
            pytest.fail(f"the connection closed mid-stream after {len(data)} more bytes")
        data += chunk
    return data


def _dechunk(body: bytes) -> bytes:
    out, i = b"", 0
    while True:
        end = body.index(b"\r\n", i)
        size = int(body[i:end].split(b";")[0], 16)
        if size == 0:
            return out
        out += body[end + 2:end + 2 + size]
        i = end + 2 + size + 2


def test_http2_unanswered_pings_close_a_stalled_stream(http_server):
    """An HTTP/2 client that holds a stream open (its window closed) and
    answers no PING is dropped; the stream had not ended."""
    h2 = H2(http_server.http)
    body = json_body({"model": QWEN, "prompt": "Once", "max_tokens": 1500, "ignore_eos": True, "stream": True})
    h2.request(1, "POST", "/v1/completions", json_headers(body), body)
    seen = h2.run_until_closed(answer_pings=False)
    assert seen["pings"] >= 1 and 1 not in seen["ended"], seen


def test_http_connection_limit(limited):
    a, b = connect(limited.http), connect(limited.http)
    assert get(a, "/version")[0] == 200 and get(b, "/version")[0] == 200
    c = connect(limited.http)  # the kernel accepts it; gyre closes it at once
    assert b"HTTP/1.1" not in wait_closed(c)
    assert get(a, "/version")[0] == 200 and get(b, "/version")[0] == 200
    a.close()
    assert _eventually(lambda: get(connect(limited.http), "/version")[0] == 200), \
        "no slot freed after a connection closed"
    b.close()


def _eventually(attempt) -> bool:
    """Retries `attempt` (a closed connection counts as not yet) for up to WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            if attempt():
                return True
        except (Closed, OSError, grpc.RpcError):
            pass
        time.sleep(0.1)
    return False


# ---------------------------------------------------------------------------
# gRPC port


def test_grpc_half_sent_preface_is_closed(grpc_server):
    sock = connect(grpc_server.grpc)
    sock.sendall(b"PRI * HTTP/2.0\r\n")
    wait_closed(sock)


def test_grpc_idle_connection_is_closed(grpc_server):
    """After a call, a connection that answers PINGs but starts nothing is closed."""
    h2 = H2(grpc_server.grpc)
    h2.request(1, "POST", "/gyre.v1.Generation/ListModels", grpc_headers(), b"\x00\x00\x00\x00\x00")
    seen = h2.run_until_closed(answer_pings=True)
    assert 1 in seen["ended"] and seen["goaway"], seen


def test_grpc_unanswered_pings_close_an_open_stream(grpc_server):
    """A bidi `Generate` stream held open by a peer that answers no PING."""
    h2 = H2(grpc_server.grpc)
    h2.request(1, "POST", "/gyre.v1.Generation/Generate", grpc_headers(), b"")
    seen = h2.run_until_closed(answer_pings=False)
    assert seen["pings"] >= 1 and 1 not in seen["ended"], seen


def _channel(address: str) -> grpc.Channel:
    # A channel of its own: its own TCP connection.
    return grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])


def test_grpc_stream_outlives_the_idle_timeout(grpc_server):
    """A bidi stream that sends its first request only after the idle timeout."""
    outbox: queue.Queue = queue.Queue()

    def requests():
        while (msg := outbox.get()) is not None:
            yield msg

    def send_later():
        time.sleep(2 * 2 + 1)  # past the idle timeout and the close grace
        outbox.put(pb.GenerateRequest(start=pb.Request(
            request_id="late", text="Once upon a time", max_tokens=50, ignore_eos=True)))

    with _channel(grpc_server.grpc) as channel:
        threading.Thread(target=send_later, daemon=True).start()
        finish = None
        for ev in pb_grpc.GenerationStub(channel).Generate(requests(), timeout=60):
            if ev.HasField("finish"):
                finish = ev.finish
                outbox.put(None)
    assert finish is not None
    assert (pb.FinishReason.Name(finish.reason), finish.usage.completion_tokens) == ("FINISH_REASON_LENGTH", 50)


def test_grpc_connection_limit(limited):
    def list_models(channel) -> bool:
        return len(pb_grpc.GenerationStub(channel).ListModels(pb.ListModelsRequest(), timeout=5).models) == 1

    a, b = _channel(limited.grpc), _channel(limited.grpc)
    assert list_models(a) and list_models(b)
    c = connect(limited.grpc)
    wait_closed(c)
    assert list_models(a) and list_models(b)
    a.close()
    d = _channel(limited.grpc)
    assert _eventually(lambda: list_models(d)), "no slot freed after a connection closed"
    b.close()
    d.close()
