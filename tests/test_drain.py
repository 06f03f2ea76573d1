"""Graceful shutdown: on SIGTERM `gyre serve` drains.

While a long streamed completion is running, SIGTERM must flip health to
not serving (HTTP /health 503, grpc.health.v1 NOT_SERVING) and refuse new
requests with 503 in the OpenAI error shape, yet let the running request
stream every token it was asked for; then the process exits with status 0.
"""

from __future__ import annotations

import signal
import threading
import time

import openai

import harness
import openai_schema
from conftest import assert_no_panic

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
