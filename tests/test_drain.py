"""Graceful shutdown: on SIGTERM `gyre serve` drains.

While a long streamed completion is running, SIGTERM must flip health to
not serving (HTTP /health 503, grpc.health.v1 NOT_SERVING) and refuse new
requests with 503 in the OpenAI error shape, yet let the running request
stream every token it was asked for; then the process exits with status 0.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import grpc
import openai
import pytest

import harness
import openai_schema
from conftest import assert_no_panic

sys.path.insert(0, str(harness.REPO / "clients" / "python"))
from gyre.v1 import generate_pb2_grpc as pb_grpc  # noqa: E402

MODEL = "tiny-qwen2"
# Long enough that the checks below run while the request is still streaming
# (thousands of engine steps); the test fails loudly rather than passing if
# the stream ends first, because the server then exits and refuses them.
MAX_TOKENS = 1900


def _poll(fn, what: str, limit_s: float = 30.0):
    """Calls `fn` until it returns a truthy value (a bounded wait, not a timing assertion)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"{what}: not observed within {limit_s} s")


def test_sigterm_drains_running_requests_then_exits():
    server = harness.serve(MODEL)
    try:
        client = openai.OpenAI(base_url=f"http://{server.http}/v1", api_key="unused", max_retries=0, timeout=120)
        first = threading.Event()
        outcome: dict = {}

        def stream() -> None:
            chunks = []
            try:
                for chunk in client.completions.create(
                    model=MODEL, prompt="Once upon a time", max_tokens=MAX_TOKENS, temperature=0,
                    stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
                ):
                    chunks.append(chunk)
                    first.set()
            except Exception as e:  # reported by the assertions below
                outcome["error"] = e
            outcome["chunks"] = chunks
            first.set()

        runner = threading.Thread(target=stream, daemon=True)
        runner.start()
        assert first.wait(60), "the stream never started"
        assert "error" not in outcome, outcome.get("error")

        server.proc.send_signal(signal.SIGTERM)

        health = _poll(
            lambda: (r := harness.http_request(server.http, "GET", "/health")).status == 503 and r,
            "HTTP /health turning 503",
        )
        err = health.json()["error"]
        openai_schema.validate("ErrorResponse", health.json())
        assert err["type"] == "server_error", err

        refused = harness.http_json(server.http, "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2})
        assert refused.status == 503, refused.body
        openai_schema.validate("ErrorResponse", refused.json())
        assert "shutting down" in refused.json()["error"]["message"]
        assert refused.json()["error"]["code"] == "draining"
        assert refused.headers.get("retry-after") == "1", refused.headers

        grpc_health = harness.buf_curl(server.grpc, "grpc.health.v1.Health/Check", {}).ok()
        assert grpc_health.messages == [{"status": "NOT_SERVING"}]

        runner.join(120)
        assert not runner.is_alive(), "the running stream did not finish"
        assert "error" not in outcome, outcome.get("error")
        chunks = outcome["chunks"]
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finishes == ["length"], finishes
        usage = chunks[-1].usage
        assert usage is not None and usage.completion_tokens == MAX_TOKENS, usage

        server.proc.wait(timeout=60)
        assert server.proc.returncode == 0, server.stderr()[-2000:]
        assert "drained: no request running" in server.stderr()
    finally:
        server.stop()
        assert_no_panic(server)
        server.remove_log()


def test_sigterm_exits_while_clients_hold_streams_open():
    # A health Watch never ends by itself, nor does a bidirectional Generate
    # stream with nothing running: once drained, shutdown must not wait on
    # them (the process stayed up for as long as such a client did).
    server = harness.serve(MODEL, "--drain-timeout", "5")
    channel = grpc.insecure_channel(server.grpc)
    try:
        watch = channel.unary_stream("/grpc.health.v1.Health/Watch",
                                     request_serializer=lambda b: b, response_deserializer=lambda b: b)(b"")
        # The first update (SERVING: field 1 = 1) says the Watch is open.
        assert next(watch) == b"\x08\x01"
        idle = threading.Event()

        def nothing():
            idle.wait(120)
            return
            yield

        bidi = pb_grpc.GenerationStub(channel).Generate(nothing())
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError("gyre serve did not exit while a Watch and a Generate stream were open")
        assert server.proc.returncode == 0, server.stderr()[-2000:]
        assert "drained: no request running" in server.stderr()
        # Both streams end (unavailable) rather than hang.
        for stream in (watch, bidi):
            with pytest.raises(grpc.RpcError) as err:
                for _ in stream:
                    pass
            assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), err.value
        idle.set()
    finally:
        channel.close()
        server.stop()
        assert_no_panic(server)
        server.remove_log()
