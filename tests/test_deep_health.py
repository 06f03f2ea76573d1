"""The deep health check (`--deep-health-interval-secs`) probes each model
through its engine (a one-token prefill and a decode) and reports what it
finds in grpc.health.v1.

A server with a 1 s interval and a 1 s probe timeout reports SERVING while
its engine answers. Then a generation as long as the context allows takes
the engine's only running slot (`--max-running 1`), so a probe cannot start
within its timeout: a real stall. The model, and the server as a whole (its
only model failed), turn NOT_SERVING, over gRPC and HTTP `/health` (503).
Once the long generation is cancelled, the next probe passes and both are
SERVING again.
"""

from __future__ import annotations

import sys
import time

import grpc

import harness
from conftest import QWEN, assert_no_panic

sys.path.insert(0, str(harness.REPO / "clients" / "python"))
from gyre.v1 import generate_pb2 as pb  # noqa: E402
from gyre.v1 import generate_pb2_grpc as pb_grpc  # noqa: E402


def http_health(server: harness.Server) -> int:
    return harness.http_request(server.http, "GET", "/health").status


def grpc_health(server: harness.Server, service: str) -> str:
    res = harness.buf_curl(server.grpc, "grpc.health.v1.Health/Check", {"service": service}).ok()
    return res.messages[0]["status"]


def wait_until(fn, what: str, limit_s: float = 20.0):
    """Calls `fn` until it returns a truthy value (a bounded wait, not a timing assertion)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if got := fn():
            return got
        time.sleep(0.05)
    raise AssertionError(f"{what}: not observed within {limit_s} s")


def hold_the_engine(server: harness.Server):
    """Starts a generation that holds the only running slot; returns its call and channel."""
    channel = grpc.insecure_channel(server.grpc)
    stub = pb_grpc.GenerationStub(channel)
    call = stub.GenerateStream(pb.Request(model=QWEN, text="Story:", ignore_eos=True))
    wait_until(lambda: stub.GetStats(pb.GetStatsRequest(model=QWEN)).running == 1, "the long generation running")
    return call, channel


def test_a_stalled_model_reports_not_serving_until_a_probe_passes(module_server):
    server = module_server(QWEN, "--max-running", "1", "--deep-health-interval-secs", "1",
                          "--deep-health-timeout-secs", "1")
    wait_until(lambda: grpc_health(server, QWEN) == "SERVING", "SERVING at start")
    assert http_health(server) == 200

    call, channel = hold_the_engine(server)
    try:
        wait_until(lambda: http_health(server) == 503, "HTTP /health 503 while the engine is stalled")
        assert grpc_health(server, QWEN) == "NOT_SERVING"
        assert grpc_health(server, "") == "NOT_SERVING"
    finally:
        call.cancel()
        channel.close()

    wait_until(lambda: http_health(server) == 200, "HTTP /health 200 once a probe passes")
    assert grpc_health(server, QWEN) == "SERVING"
    assert grpc_health(server, "") == "SERVING"
    follow = harness.http_json(server.http, "/v1/completions",
                               {"model": QWEN, "prompt": "Hi", "max_tokens": 3, "ignore_eos": True})
    assert follow.status == 200, follow.body
    assert_no_panic(server)

