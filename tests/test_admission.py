"""Admission that means what it says: `--max-queue` counts requests waiting
while the engine is full, not a burst the engine can start at its next step.
A server admits up to `--max-running` + `--max-queue` requests at once
(running or waiting): a burst of 150 against an idle server whose 64 running
slots and queue of 86 hold 150 is served whole, with no 429; a request beyond
a full engine and a full queue still gets 429 with `Retry-After` over HTTP
and RESOURCE_EXHAUSTED over gRPC, both with the place it would have taken in
the queue (`X-Queue-Position` / `x-queue-position`)."""

from __future__ import annotations

import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import grpc

import harness
from conftest import QWEN

sys.path.insert(0, str(harness.REPO / "clients" / "python"))
from gyre.v1 import generate_pb2 as pb  # noqa: E402
from gyre.v1 import generate_pb2_grpc as pb_grpc  # noqa: E402


def test_a_burst_that_fits_running_slots_plus_queue_gets_no_429(module_server):
    server = module_server(QWEN, "--max-running", "64", "--max-queue", "86")

    def complete(i: int) -> harness.HttpReply:
        body = {"model": QWEN, "prompt": f"Request {i} says", "max_tokens": 4, "ignore_eos": True}
        return harness.http_json(server.http, "/v1/completions", body)

    with ThreadPoolExecutor(max_workers=150) as pool:
        replies = list(pool.map(complete, range(150)))
    statuses = Counter(r.status for r in replies)
    assert statuses == {200: 150}, [r.body[:300] for r in replies if r.status != 200][:3]
    assert all(r.json()["usage"]["completion_tokens"] == 4 for r in replies)


def test_a_request_beyond_a_full_engine_and_queue_is_refused(module_server):
    server = module_server(QWEN, "--max-running", "2", "--max-queue", "1")
    channel = grpc.insecure_channel(server.grpc)
    stub = pb_grpc.GenerationStub(channel)
    # Three generations as long as the context allows: two run, one waits.
    calls = [stub.GenerateStream(pb.Request(model=QWEN, text=f"Story {i}:", ignore_eos=True))
             for i in range(3)]
    try:
        for _ in range(100_000):
            stats = stub.GetStats(pb.GetStatsRequest(model=QWEN))
            if stats.running == 2 and stats.waiting == 1:
                break
        assert (stats.running, stats.waiting) == (2, 1), stats

        body = {"model": QWEN, "prompt": "One more", "max_tokens": 4}
        reply = harness.http_json(server.http, "/v1/completions", body)
        assert reply.status == 429, reply.body
        err = reply.json()["error"]
        assert err["type"] == "rate_limit_error" and err["code"] == "queue_full", err
        assert reply.headers.get("retry-after"), reply.headers
        # One request waits: this one would have been second in line.
        assert reply.headers.get("x-queue-position") == "2", reply.headers

        one_more = stub.GenerateStream(pb.Request(model=QWEN, text="One more", max_tokens=4))
        try:
            next(one_more)
            raise AssertionError("a request beyond the queue was served")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
            meta = dict(e.trailing_metadata() or ())
            assert meta.get("x-queue-position") == "2", meta
    finally:
        for call in calls:
            call.cancel()
        channel.close()
