"""The serving engine seen from outside: prefix-cache hits reach OpenAI usage
(`prompt_tokens_details.cached_tokens`) and gRPC usage, `GetStats` reports
blocks, hits and steps, and a storm of abandoned streams leaves no KV block
in use. Runs its own server (tiny-llama) so the counters start from zero."""

import socket

import pytest

import harness

MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def server(start_server) -> harness.Server:
    return start_server(MODEL)


def stats(server: harness.Server) -> dict:
    [s] = harness.buf_curl(server.grpc, "gyre.v1.Generation/GetStats", {}).ok().messages
    return s


def completion(server: harness.Server, prompt: list[int], **extra) -> dict:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True, **extra}
    reply = harness.http_json(server.http, "/v1/completions", body)
    assert reply.status == 200, reply.body
    return reply.json()


def long_prompt(seed: int, n: int) -> list[int]:
    return [100 + (seed * 7919 + i * 104729) % 31000 for i in range(n)]


def test_prefix_cache_hits_are_reported_in_usage_and_stats(server):
    before = stats(server)
    assert before["model"] == MODEL
    assert int(before["kvBlocksTotal"]) > 0 and int(before["blockSize"]) == 16
    shared = long_prompt(1, 100)
    first = completion(server, shared + [5, 6, 7])
    second = completion(server, shared + [8, 9])
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    # 100 shared tokens = 6 full blocks of 16 = 96 reusable tokens.
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 96
    salted = completion(server, shared + [8, 9], cache_salt="tenant-x")
    assert salted["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert salted["choices"][0]["text"] == second["choices"][0]["text"], "a cache hit must not change the output"
    after = stats(server)
    hits = int(after.get("prefixHitTokensTotal", 0)) - int(before.get("prefixHitTokensTotal", 0))
    assert hits == 96
    assert int(after["stepsTotal"]) > int(before.get("stepsTotal", 0))


def test_grpc_usage_reports_cached_tokens(server):
    ids = long_prompt(2, 40)
    req = {"tokenIds": {"ids": ids}, "maxTokens": 2, "ignoreEos": True, "sampling": {"temperature": 0}}
    harness.buf_curl(server.grpc, "gyre.v1.Generation/GenerateStream", req).ok()
    events = harness.buf_curl(server.grpc, "gyre.v1.Generation/GenerateStream", req).ok().messages
    usage = events[-1]["finish"]["usage"]
    assert int(usage["cachedTokens"]) == 32


def test_abandoned_streams_leave_no_block_in_use(server):
    # Open many streaming requests, read the first bytes of each, hang up.
    socks = []
    for i in range(24):
        body = ('{"model": "%s", "prompt": %s, "max_tokens": 1500, "ignore_eos": true, "stream": true}'
                % (MODEL, long_prompt(10 + i, 30))).encode()
        host, port = server.http.rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=60)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        socks.append(s)
    for s in socks:
        assert b"data:" in s.recv(4096)
    busy = stats(server)
    assert int(busy.get("running", 0)) + int(busy.get("waiting", 0)) > 0
    for s in socks:
        s.close()
    # The engine frees a cancelled request's blocks within a step; poll the
    # (cheap) stats call until everything has drained.
    for _ in range(600):
        s = stats(server)
        if int(s.get("running", 0)) == 0 and int(s.get("waiting", 0)) == 0:
            break
    else:
        pytest.fail(f"requests still running after the clients left: {s}")
    assert int(s.get("kvBlocksUsed", 0)) == 0, s


def test_parallel_choices_over_grpc(server):
    req = {"tokenIds": {"ids": long_prompt(3, 40)}, "maxTokens": 6, "ignoreEos": True, "n": 3,
           "sampling": {"temperature": 1.0, "seed": "5"}}
    events = harness.buf_curl(server.grpc, "gyre.v1.Generation/GenerateStream", req).ok().messages
    by_choice: dict[int, list[dict]] = {}
    for ev in events:
        by_choice.setdefault(int(ev.get("index", 0)), []).append(ev)
    assert sorted(by_choice) == [0, 1, 2]
    texts = []
    for evs in by_choice.values():
        finishes = [e for e in evs if "finish" in e]
        assert len(finishes) == 1 and evs[-1] is finishes[0]
        assert finishes[0]["finish"]["reason"] == "FINISH_REASON_LENGTH"
        assert int(finishes[0]["finish"]["usage"]["completionTokens"]) == 6
        texts.append([t for e in evs if "delta" in e for t in e["delta"].get("tokenIds", [])])
    assert all(len(t) == 6 for t in texts)
    assert len({tuple(t) for t in texts}) > 1, "seeded choices should differ"
    # Choice i is reproducible: the same request gives the same tokens.
    again = harness.buf_curl(server.grpc, "gyre.v1.Generation/GenerateStream", req).ok().messages
    def deltas(evs):
        return [e["delta"] for e in evs if "delta" in e and int(e.get("index", 0)) == 2]
    assert deltas(again) == deltas(events)


def test_cancel_reaches_every_choice(server):
    start = {"start": {"requestId": "multi", "tokenIds": {"ids": long_prompt(4, 20)}, "maxTokens": 1500,
                       "ignoreEos": True, "n": 2}}
    msgs = harness.buf_curl(server.grpc, "gyre.v1.Generation/Generate",
                            [start, {"cancel": {"requestId": "multi"}}]).ok().messages
    finishes = {int(m.get("index", 0)): m["finish"]["reason"] for m in msgs if "finish" in m}
    assert finishes == {0: "FINISH_REASON_CANCELLED", 1: "FINISH_REASON_CANCELLED"}


def test_unset_max_tokens_fits_the_kv_cache(start_server):
    # 4 blocks of 16 = 64 tokens of KV cache, far below the 2048-token context.
    small = start_server("tiny-qwen2", "--num-kv-blocks", "4")
    prompt = long_prompt(5, 10)
    body = {"model": "tiny-qwen2", "prompt": prompt, "temperature": 0, "ignore_eos": True}
    reply = harness.http_json(small.http, "/v1/completions", body)
    assert reply.status == 200, reply.body
    out = reply.json()
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 64 - 10
    too_many = harness.http_json(small.http, "/v1/completions", {**body, "max_tokens": 100})
    assert too_many.status == 400, too_many.body
    assert too_many.json()["error"]["param"] == "max_tokens"


def test_max_tokens_over_the_context_is_400_unless_clamped(start_server):
    small = start_server("tiny-qwen2", "--num-kv-blocks", "4")
    body = {"model": "tiny-qwen2", "prompt": long_prompt(6, 10), "max_tokens": 1000, "temperature": 0,
            "ignore_eos": True}
    refused = harness.http_json(small.http, "/v1/completions", body)
    assert refused.status == 400 and refused.json()["error"]["param"] == "max_tokens"
    clamped = harness.http_json(small.http, "/v1/completions", {**body, "clamp_max_tokens": True})
    assert clamped.status == 200, clamped.body
    assert clamped.json()["usage"]["completion_tokens"] == 64 - 10
