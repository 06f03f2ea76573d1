"""The shim's connections to the service break mid-request (`gyre grpc` is
killed): every stream in flight ends with one OpenAI-shaped 503-class error
event (`upstream_unavailable`) and no `[DONE]`, never a silently truncated
stream; a request that is not streamed gets HTTP 503, also once the service
is gone.
"""

from __future__ import annotations

import http.client
import json
import threading

import pytest

import harness
import openai_schema
from conftest import QWEN, assert_no_panic
from conn_util import WAIT_S

STREAMS = 6


@pytest.fixture
def pair():
    grpc = harness.Server.start(
        [str(harness.GYRE_BIN), "grpc", "--model", str(harness.model_dir(QWEN)), "--grpc-addr", "127.0.0.1:0"],
        want=("gRPC",))
    try:
        shim = harness.Server.start(
            [str(harness.SHIM_BIN), "--grpc-endpoint", f"http://{grpc.grpc}", "--http-addr", "127.0.0.1:0",
             "--upstream-connections", "2"],
            want=("HTTP",))
    except BaseException:
        grpc.stop()
        raise
    yield grpc, shim
    shim.stop()
    grpc.stop()
    try:
        assert_no_panic(shim)
    finally:
        grpc.remove_log()
        shim.remove_log()


class Stream:
    """A streamed chat completion read line by line on its own thread."""

    def __init__(self, address: str, i: int):
        host, port = address.rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=WAIT_S * 4)
        body = json.dumps({"model": QWEN, "messages": [{"role": "user", "content": f"Story {i}"}],
                           "max_tokens": 1800, "ignore_eos": True, "stream": True})
        self.conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        self.response = self.conn.getresponse()
        self.events: list[str] = []
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for line in self.response:
                if line.startswith(b"data:"):
                    self.events.append(line[5:].strip().decode())
                    self.started.set()
        finally:
            self.started.set()
            self.conn.close()


def test_streams_in_flight_end_with_an_error_event(pair):
    grpc, shim = pair
    whole: list[harness.HttpReply] = []
    # A request that is not streamed, running when the connection drops.
    unstreamed = threading.Thread(target=lambda: whole.append(harness.http_json(
        shim.http, "/v1/completions", {"model": QWEN, "prompt": "Once", "max_tokens": 1800, "ignore_eos": True})))
    unstreamed.start()
    streams = [Stream(shim.http, i) for i in range(STREAMS)]
    assert all(s.response.status == 200 for s in streams)
    for s in streams:
        assert s.started.wait(WAIT_S), "a stream sent nothing"
    grpc.proc.kill()  # not a drain: the connections drop mid-stream
    for s in streams:
        s.thread.join(WAIT_S * 2)
        assert not s.thread.is_alive(), "a stream did not end after the service died"
    for i, s in enumerate(streams):
        assert s.events and s.events[-1] != "[DONE]", f"stream {i} was not cut: {s.events[-2:]}"
        last = json.loads(s.events[-1])
        openai_schema.validate(openai_schema.ERROR, last)
        assert (last["error"]["type"], last["error"]["code"]) == ("server_error", "upstream_unavailable"), last
        # Everything before the error is ordinary chunks.
        assert all("error" not in json.loads(e) for e in s.events[:-1])
    unstreamed.join(WAIT_S * 2)
    assert whole and whole[0].status == 503, whole and whole[0].body
    assert whole[0].json()["error"]["code"] == "upstream_unavailable"
    assert shim.alive()
    # With the service gone, a request that is not streamed is a 503.
    reply = harness.http_json(shim.http, "/v1/chat/completions",
                              {"model": QWEN, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert reply.status == 503, reply.body
    assert reply.json()["error"]["type"] == "server_error"
