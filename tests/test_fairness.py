"""Weighted fair queuing between tenants, end to end through a keys file.

A real `gyre serve --keys-file` with two running slots (`--max-running 2`)
and a deep queue: the keys file names each request's tenant and weight, the
interceptor attaches them, and the engine's scheduler admits the waiting
request of the tenant that has run the fewest tokens per unit of weight.
Every request is greedy with a fixed length (`max_tokens`, `ignore_eos`), so
each costs the engine the same and the order in which requests start and
finish follows from the scheduler alone, not from timing.

- Equal weights, one tenant sending ten times the other's load: "heavy"
  floods the queue over gRPC first; once 20 or more of its requests wait,
  "light" sends its few over HTTP (through the shim, which forwards the key).
  First come, first served would finish all of heavy's backlog first; fair
  queuing alternates free slots between the two, so light's last request
  finishes after only a handful more of heavy's.
- Weights 3 and 1, both backlogged: of the requests started while both have
  work waiting, about three quarters are the weight-3 tenant's.

Assertions are on the order of events, with margins, never on time.
"""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

import harness
from conftest import QWEN
from test_tenants import keys_file

sys.path.insert(0, str(harness.REPO / "clients" / "python"))
from gyre.v1 import generate_pb2 as pb  # noqa: E402
from gyre.v1 import generate_pb2_grpc as pb_grpc  # noqa: E402

# Tokens each request generates: every request costs the same.
TOKENS = 16
# How long the test waits for a state it caused (a backlog, the last answer).
EFFECT_S = 120.0


class Log:
    """Events ("start" or "done", tenant) in the order they happened."""

    def __init__(self):
        self._lock = threading.Lock()
        self.events: list[tuple[str, str]] = []

    def add(self, what: str, tenant: str) -> None:
        with self._lock:
            self.events.append((what, tenant))

    def of(self, what: str) -> list[str]:
        with self._lock:
            return [t for w, t in self.events if w == what]


def grpc_generation(server: harness.Server, log: Log, tenant: str, i: int) -> None:
    """One streamed generation over gRPC with `key-<tenant>`; logs its first
    event (the engine started it) and its end."""
    with grpc.insecure_channel(server.grpc) as channel:
        call = pb_grpc.GenerationStub(channel).GenerateStream(
            pb.Request(model=QWEN, text=f"Request {i} of {tenant}:", max_tokens=TOKENS, ignore_eos=True),
            metadata=[("authorization", f"Bearer key-{tenant}")], timeout=EFFECT_S)
        generated = 0
        for n, message in enumerate(call):
            if n == 0:
                log.add("start", tenant)
            if message.HasField("finish"):
                generated = message.finish.usage.completion_tokens
        assert generated == TOKENS, (tenant, i, generated)
        log.add("done", tenant)


def http_generation(server: harness.Server, log: Log, tenant: str, i: int) -> None:
    """One completion over HTTP with `key-<tenant>`; logs its end."""
    body = {"model": QWEN, "prompt": f"Request {i} of {tenant}:", "max_tokens": TOKENS, "ignore_eos": True}
    reply = harness.http_json(server.http, "/v1/completions", body,
                              headers={"Authorization": f"Bearer key-{tenant}"})
    assert reply.status == 200, reply.body
    assert reply.json()["usage"]["completion_tokens"] == TOKENS
    log.add("done", tenant)


def waiting(server: harness.Server, key: str) -> int:
    """Requests queued in the engine (GetStats, authenticated)."""
    with grpc.insecure_channel(server.grpc) as channel:
        stats = pb_grpc.GenerationStub(channel).GetStats(
            pb.GetStatsRequest(model=QWEN), metadata=[("authorization", f"Bearer {key}")])
    return stats.waiting


def wait_for_backlog(server: harness.Server, key: str, at_least: int) -> None:
    deadline = time.monotonic() + EFFECT_S
    while waiting(server, key) < at_least:
        assert time.monotonic() < deadline, f"fewer than {at_least} requests ever waited"
        time.sleep(0.02)  # polling, not waiting for readiness: leave the server the cores


@pytest.fixture(scope="module")
def fair_server(tmp_path_factory, module_server) -> harness.Server:
    tenants = {"heavy": {}, "light": {}, "one": {"weight": 1}, "three": {"weight": 3}}
    path = tmp_path_factory.mktemp("keys") / "keys.toml"
    path.write_text(keys_file(tenants, {f"key-{t}": t for t in tenants}))
    return module_server(QWEN, "--keys-file", str(path), "--max-running", "2", "--max-queue", "256")


def test_a_tenant_sending_ten_times_the_load_does_not_starve_the_other(fair_server):
    log = Log()
    heavy_n, light_n = 40, 4
    with ThreadPoolExecutor(max_workers=heavy_n + light_n) as pool:
        heavy = [pool.submit(grpc_generation, fair_server, log, "heavy", i) for i in range(heavy_n)]
        # Heavy's backlog is in the queue before light sends anything.
        wait_for_backlog(fair_server, "key-heavy", 20)
        heavy_done_before = len(log.of("done"))
        light = [pool.submit(http_generation, fair_server, log, "light", i) for i in range(light_n)]
        for f in light + heavy:
            f.result(timeout=EFFECT_S)

    done = log.of("done")
    assert done.count("heavy") == heavy_n and done.count("light") == light_n, done
    last_light = max(i for i, t in enumerate(done) if t == "light")
    heavy_after_light_came = done[heavy_done_before:last_light].count("heavy")
    backlog = heavy_n - heavy_done_before
    # First come, first served: light finishes after all of heavy's backlog
    # (at least 20 requests). Fair queuing: after the two heavy requests
    # running when light came and about one heavy request per light one.
    # The margin allows for heavy requests that had not reached the queue.
    assert heavy_after_light_came <= 2 + 2 * light_n, (
        f"{heavy_after_light_came} of heavy's {backlog} outstanding requests finished before light's last: {done}")


def test_weights_set_each_tenants_share_of_the_engine(fair_server):
    log = Log()
    each = 40
    with ThreadPoolExecutor(max_workers=2 * each) as pool:
        ones = [pool.submit(grpc_generation, fair_server, log, "one", i) for i in range(each)]
        wait_for_backlog(fair_server, "key-one", 20)
        threes = [pool.submit(grpc_generation, fair_server, log, "three", i) for i in range(each)]
        for f in ones + threes:
            f.result(timeout=EFFECT_S)

    started = log.of("start")
    assert started.count("one") == each and started.count("three") == each, started
    # From the weight-3 tenant's first start on, both have work waiting for
    # the next 32 starts (each of them has 40 requests, and the weight-1
    # tenant's backlog was 20 or more): weight 3 should get 24 of them, and
    # equal shares would give it 16.
    first = started.index("three")
    window = started[first:first + 32]
    share = window.count("three") / len(window)
    assert 0.62 <= share <= 0.88, f"weight 3 got {window.count('three')} of {len(window)} starts: {started}"
