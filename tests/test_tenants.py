"""Tenants, keys and quotas (`--keys-file`), on both protocols.

Every auth and quota case runs over HTTP (raw requests and the official
OpenAI SDK, through the shim, which forwards the client's key) and over gRPC
(the generated Python client, `authorization` metadata): 401 / UNAUTHENTICATED
for a missing or unknown key, 403 / PERMISSION_DENIED for a model the tenant
may not use, 429 / RESOURCE_EXHAUSTED over requests per minute, tokens per
minute (reserved at admission, settled to the real count at the end) and
concurrent streams, with `Retry-After` and the `x-ratelimit-*` headers
(response metadata on gRPC). The keys file reloads on change and on SIGHUP,
a bad file keeps the old keys (and fails a start), and `--open-endpoints`
leaves health and reflection open.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import signal
import subprocess
import sys
import time

import grpc
import openai
import pytest

import harness
from conftest import QWEN, assert_no_panic

sys.path.insert(0, str(harness.REPO / "clients" / "python"))
from gyre.v1 import generate_pb2 as pb  # noqa: E402
from gyre.v1 import generate_pb2_grpc as pb_grpc  # noqa: E402

LLAMA = "tiny-llama"
PROMPT = "The capital of France is"
PROTOCOLS = ("http", "grpc")
# How long a test waits for an effect it caused (a reload, a settle).
EFFECT_S = 15.0


def key_hash(key: str) -> str:
    """The key's hash as `gyre keys hash` prints it (checked against hashlib)."""
    out = subprocess.run([str(harness.GYRE_BIN), "keys", "hash", key], capture_output=True, text=True,
                         timeout=60, check=True).stdout.strip()
    assert out == hashlib.sha256(key.encode()).hexdigest(), out
    return out


def keys_file(tenants: dict[str, dict], keys: dict[str, str]) -> str:
    """TOML text: `tenants` (name -> settings), `keys` (key -> tenant)."""
    lines = []
    for name, settings in tenants.items():
        lines.append(f"[tenants.{name}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
    for key, tenant in keys.items():
        lines += ["[[keys]]", f'sha256 = "{key_hash(key)}"', f'tenant = "{tenant}"']
    return "\n".join(lines) + "\n"


TPM = 2000
TENANTS = {
    "free": {},
    "narrow": {"models": [LLAMA]},
    **{f"rpm_{p}": {"requests_per_minute": 2} for p in PROTOCOLS},
    **{f"tpm_{p}": {"tokens_per_minute": TPM} for p in PROTOCOLS},
    **{f"settle_{p}": {"tokens_per_minute": 1000} for p in PROTOCOLS},
    **{f"conc_{p}": {"max_concurrent_streams": 1} for p in PROTOCOLS},
}
KEYS = {f"key-{t}": t for t in TENANTS}


@pytest.fixture(scope="module")
def tenants(tmp_path_factory, module_server) -> harness.Server:
    path = tmp_path_factory.mktemp("keys") / "keys.toml"
    path.write_text(keys_file(TENANTS, KEYS))
    return module_server(QWEN, "--model", str(harness.model_dir(LLAMA)), "--keys-file", str(path))


class Reply:
    """One generation's outcome on either protocol."""

    def __init__(self, status: int, headers: dict[str, str], body: dict):
        self.status, self.headers, self.body = status, headers, body

    @property
    def error(self) -> dict:
        return self.body["error"]


GRPC_TO_HTTP = {
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
}


def generate(server: harness.Server, protocol: str, key: str | None, model: str = QWEN, max_tokens: int = 4,
             **extra) -> Reply:
    """A completion of PROMPT; gRPC codes are told as their HTTP statuses
    (other codes fail the test) and gRPC metadata as headers."""
    if protocol == "http":
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, **extra}
        r = harness.http_json(server.http, "/v1/completions", body, headers=headers)
        return Reply(r.status, r.headers, r.json())
    metadata = [("authorization", f"Bearer {key}")] if key else []
    with grpc.insecure_channel(server.grpc) as channel:
        call = pb_grpc.GenerationStub(channel).GenerateStream(
            pb.Request(model=model, text=PROMPT, max_tokens=max_tokens, **extra), metadata=metadata)
        try:
            usage = None
            for message in call:
                if message.HasField("finish"):
                    usage = message.finish.usage
            meta = dict(call.initial_metadata())
            body = {"usage": {"prompt_tokens": usage.prompt_tokens,
                              "completion_tokens": usage.completion_tokens,
                              "total_tokens": usage.prompt_tokens + usage.completion_tokens}}
            return Reply(200, meta, body)
        except grpc.RpcError as e:
            assert e.code() in GRPC_TO_HTTP, (e.code(), e.details())
            meta = {**dict(e.initial_metadata() or ()), **dict(e.trailing_metadata() or ())}
            return Reply(GRPC_TO_HTTP[e.code()], meta, {"error": {"message": e.details()}})


def assert_openai_error(reply: Reply, status: int, kind: str, code: str | None, param: str | None = None):
    assert reply.status == status, reply.body
    err = reply.error
    if len(err) > 1:  # HTTP: the whole OpenAI shape
        assert set(err) == {"message", "type", "param", "code"}, err
        assert (err["type"], err["code"], err["param"]) == (kind, code, param), err
    assert err["message"], err


# --- keys ------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_missing_or_unknown_key_is_refused_and_a_known_one_served(tenants, protocol):
    assert_openai_error(generate(tenants, protocol, None), 401, "authentication_error", "invalid_api_key")
    assert_openai_error(generate(tenants, protocol, "key-nobody"), 401, "authentication_error", "invalid_api_key")
    ok = generate(tenants, protocol, "key-free")
    assert ok.status == 200, ok.body
    assert ok.body["usage"]["completion_tokens"] >= 1
    # A tenant without limits gets no rate-limit headers.
    assert not [h for h in ok.headers if h.startswith("x-ratelimit-")], ok.headers


def test_the_openai_sdk_authenticates_with_a_tenant_key(tenants):
    good = openai.OpenAI(base_url=f"http://{tenants.http}/v1", api_key="key-free", max_retries=0)
    out = good.chat.completions.create(model=QWEN, messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
    assert out.usage.completion_tokens >= 1
    assert QWEN in [m.id for m in good.models.list().data]
    bad = openai.OpenAI(base_url=f"http://{tenants.http}/v1", api_key="key-nobody", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=QWEN, messages=[{"role": "user", "content": "Hi"}], max_tokens=3)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_model_the_tenant_may_not_use_is_403(tenants, protocol):
    refused = generate(tenants, protocol, "key-narrow", QWEN)
    assert_openai_error(refused, 403, "permission_error", "model_not_allowed", "model")
    assert QWEN in refused.error["message"]
    assert generate(tenants, protocol, "key-narrow", LLAMA).status == 200
    # Another tenant may use both.
    assert generate(tenants, protocol, "key-free", QWEN).status == 200


def test_the_responses_api_and_tokenize_check_the_model_too(tenants):
    auth = {"Authorization": "Bearer key-narrow"}
    r = harness.http_json(tenants.http, "/v1/responses", {"model": QWEN, "input": "Hi", "max_output_tokens": 3},
                          headers=auth)
    assert r.status == 403 and r.json()["error"]["code"] == "model_not_allowed", r.body
    r = harness.http_json(tenants.http, "/tokenize", {"model": QWEN, "prompt": "Hi"}, headers=auth)
    assert r.status == 403, r.body
    r = harness.http_json(tenants.http, "/tokenize", {"model": LLAMA, "prompt": "Hi"}, headers=auth)
    assert r.status == 200, r.body


# --- quotas ----------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_requests_per_minute_429_with_retry_after_and_headers(tenants, protocol):
    key = f"key-rpm_{protocol}"
    for left in (1, 0):
        ok = generate(tenants, protocol, key)
        assert ok.status == 200, ok.body
        assert ok.headers["x-ratelimit-limit-requests"] == "2", ok.headers
        assert ok.headers["x-ratelimit-remaining-requests"] == str(left), ok.headers
        assert ok.headers["x-ratelimit-reset-requests"].endswith("s"), ok.headers
    refused = generate(tenants, protocol, key)
    assert_openai_error(refused, 429, "rate_limit_error", "rate_limit_exceeded")
    assert "requests per minute" in refused.error["message"]
    assert refused.headers["x-ratelimit-remaining-requests"] == "0", refused.headers
    assert refused.headers["x-ratelimit-limit-requests"] == "2", refused.headers
    if protocol == "http":
        assert 1 <= int(refused.headers["retry-after"]) <= 60, refused.headers
    # Another tenant is not affected.
    assert generate(tenants, protocol, "key-free").status == 200


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_tokens_settle_to_the_real_usage(tenants, protocol):
    """Each request reserves prompt + max_tokens; the next one's remaining
    tokens show the first settled to exactly its usage."""
    key = f"key-settle_{protocol}"
    first = generate(tenants, protocol, key, max_tokens=20)
    assert first.status == 200, first.body
    prompt = first.body["usage"]["prompt_tokens"]
    assert first.headers["x-ratelimit-limit-tokens"] == "1000", first.headers
    assert int(first.headers["x-ratelimit-remaining-tokens"]) == 1000 - (prompt + 20), first.headers
    second = generate(tenants, protocol, key, max_tokens=20)
    assert second.status == 200, second.body
    used = first.body["usage"]["total_tokens"]
    assert int(second.headers["x-ratelimit-remaining-tokens"]) == 1000 - used - (prompt + 20), second.headers


def open_stream(server: harness.Server, protocol: str, key: str, max_tokens: int | None = None):
    """Starts a long streamed completion and reads its first event; returns
    a function that closes it (the client leaving)."""
    if protocol == "http":
        host, port = server.http.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        body = {"model": QWEN, "prompt": PROMPT, "stream": True, "ignore_eos": True}
        if max_tokens:
            body["max_tokens"] = max_tokens
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        assert resp.readline().startswith(b"data:")
        return conn.close
    channel = grpc.insecure_channel(server.grpc)
    req = pb.Request(model=QWEN, text=PROMPT, ignore_eos=True)
    if max_tokens:
        req.max_tokens = max_tokens
    call = pb_grpc.GenerationStub(channel).GenerateStream(req, metadata=[("authorization", f"Bearer {key}")])
    next(call)

    def close():
        call.cancel()
        channel.close()
    return close


def until_served(server, protocol, key, **kw) -> Reply:
    """Retries while the effect of a request's end has not arrived (429)."""
    deadline = time.monotonic() + EFFECT_S
    while True:
        reply = generate(server, protocol, key, **kw)
        if reply.status != 429 or time.monotonic() > deadline:
            return reply


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_reservation_too_large_is_refused_until_the_first_settles(tenants, protocol):
    key = f"key-tpm_{protocol}"
    close = open_stream(tenants, protocol, key, max_tokens=1500)
    try:
        # 1500 + prompt reserved: 1000 more do not fit in 2000.
        refused = generate(tenants, protocol, key, max_tokens=1000)
        assert_openai_error(refused, 429, "rate_limit_error", "rate_limit_exceeded")
        assert "tokens per minute" in refused.error["message"]
        assert refused.headers["x-ratelimit-limit-tokens"] == str(TPM), refused.headers
        assert int(refused.headers["x-ratelimit-remaining-tokens"]) < 1000, refused.headers
    finally:
        close()
    # The client left early: its reservation settles to what it used.
    later = until_served(tenants, protocol, key, max_tokens=1000)
    assert later.status == 200, later.body
    remaining = int(later.headers["x-ratelimit-remaining-tokens"])
    reserve = later.body["usage"]["prompt_tokens"] + 1000
    # The early leaver's real usage (its prompt and a token at least) still
    # counts: the settle is to the real usage, not to nothing.
    assert remaining <= TPM - reserve - (later.body["usage"]["prompt_tokens"] + 1), later.headers


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_concurrent_streams_over_the_limit_get_429(tenants, protocol):
    key = f"key-conc_{protocol}"
    close = open_stream(tenants, protocol, key)
    try:
        refused = generate(tenants, protocol, key)
        assert_openai_error(refused, 429, "rate_limit_error", "rate_limit_exceeded")
        assert "concurrent streams" in refused.error["message"]
        # The other protocol's requests are the same tenant's only when
        # the key is; another tenant runs beside it.
        assert generate(tenants, protocol, "key-free").status == 200
    finally:
        close()
    assert until_served(tenants, protocol, key).status == 200


# --- the keys file: reloads, bad files -------------------------------------


def wait_for(predicate, what: str):
    deadline = time.monotonic() + EFFECT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture
def reloadable(tmp_path):
    path = tmp_path / "keys.toml"
    path.write_text(keys_file({"team": {}}, {"key-one": "team"}))
    server = harness.serve(QWEN, "--keys-file", str(path))
    yield server, path
    server.stop()
    assert_no_panic(server)
    server.remove_log()


def status_of(server, key: str) -> tuple[int, int]:
    """(HTTP status, gRPC status as HTTP) of a small generation with `key`."""
    return generate(server, "http", key).status, generate(server, "grpc", key).status


def test_the_keys_file_reloads_on_change_and_on_sighup_and_keeps_old_keys_when_bad(reloadable):
    server, path = reloadable
    assert status_of(server, "key-one") == (200, 200)
    assert status_of(server, "key-two") == (401, 401)

    # Rewritten: the new key works, the old one no longer does.
    path.write_text(keys_file({"team": {}}, {"key-two": "team"}))
    wait_for(lambda: generate(server, "http", "key-two").status == 200, "the rewritten file to load")
    assert status_of(server, "key-two") == (200, 200)
    assert status_of(server, "key-one") == (401, 401)

    # A bad file is refused, logged, and the keys stay as they were.
    failures = server.stderr().count("keys file reload failed")
    path.write_text("this is [not toml")
    wait_for(lambda: server.stderr().count("keys file reload failed") > failures, "the bad file to be refused")
    assert status_of(server, "key-two") == (200, 200)

    # SIGHUP: a change the file watch cannot see (same length and
    # modification time, swapped in at once) is read on the signal.
    reloads = server.stderr().count("keys file reloaded")
    path.write_text(keys_file({"team": {}}, {"key-two": "team"}))
    wait_for(lambda: server.stderr().count("keys file reloaded") > reloads, "the repaired file to load")
    before = path.stat()
    swap = path.with_suffix(".new")
    swap.write_text(keys_file({"team": {}}, {"key-six": "team"}))
    os.utime(swap, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(swap, path)
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert status_of(server, "key-six") == (401, 401)
    os.kill(server.pid, signal.SIGHUP)
    wait_for(lambda: generate(server, "http", "key-six").status == 200, "SIGHUP to reload the file")
    assert status_of(server, "key-six") == (200, 200)
    assert status_of(server, "key-two") == (401, 401)
    text = server.stderr()
    assert "SIGHUP" in text and "gyre::audit" in text, text[-3000:]
    assert "key-six" not in text and "key-two" not in text, "a key reached the log"


def test_a_bad_keys_file_fails_the_start(tmp_path):
    path = tmp_path / "keys.toml"
    path.write_text('[[keys]]\nsha256 = "not a hash"\ntenant = "t"\n')
    argv = [str(harness.GYRE_BIN), "serve", "--model", str(harness.model_dir(QWEN)),
            "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--keys-file", str(path)]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert p.returncode != 0
    assert "64 hex digits" in p.stderr and str(path) in p.stderr, p.stderr[-2000:]
    assert "listening" not in p.stdout


# --- open endpoints --------------------------------------------------------


def health(server: harness.Server, key: str | None) -> tuple[int, object]:
    """(HTTP /health status, gRPC health Check code)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    http_status = harness.http_request(server.http, "GET", "/health", headers=headers).status
    metadata = [("authorization", f"Bearer {key}")] if key else []
    with grpc.insecure_channel(server.grpc) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        try:
            # An empty HealthCheckRequest; SERVING is field 1 = 1.
            assert check(b"", metadata=metadata) == b"\x08\x01"
            code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            code = e.code()
    return http_status, code


def reflection_works(server: harness.Server) -> bool:
    argv = [str(harness.BUF), "curl", "--protocol", "grpc", "--http2-prior-knowledge", "--reflect",
            "--list-services", f"http://{server.grpc}"]
    return harness.run_group(argv, None, 60).returncode == 0


def test_health_and_reflection_need_a_key_unless_left_open(tenants, tmp_path, module_server):
    assert health(tenants, None) == (401, grpc.StatusCode.UNAUTHENTICATED)
    assert health(tenants, "key-free") == (200, grpc.StatusCode.OK)
    assert not reflection_works(tenants)

    path = tmp_path / "keys.toml"
    path.write_text(keys_file({"team": {}}, {"key-one": "team"}))
    server = module_server(QWEN, "--keys-file", str(path), "--open-endpoints")
    assert health(server, None) == (200, grpc.StatusCode.OK)
    assert reflection_works(server)
    # Generation still needs a key.
    assert status_of(server, "key-nobody") == (401, 401)
    assert status_of(server, "key-one") == (200, 200)


# --- the standalone shim ---------------------------------------------------


def test_a_standalone_shim_forwards_each_clients_key(tmp_path):
    path = tmp_path / "keys.toml"
    path.write_text(keys_file({"team": {"requests_per_minute": 5}, "other": {"models": ["x"]}},
                              {"key-one": "team", "key-two": "other"}))
    service = harness.Server.start(
        [str(harness.GYRE_BIN), "grpc", "--model", str(harness.model_dir(QWEN)), "--grpc-addr", "127.0.0.1:0",
         "--keys-file", str(path)], want=("gRPC",))
    try:
        shim = harness.Server.start(
            [str(harness.SHIM_BIN), "--grpc-endpoint", f"http://{service.grpc}", "--http-addr", "127.0.0.1:0"],
            want=("HTTP",))
        try:
            ok = generate(shim, "http", "key-one")
            assert ok.status == 200 and ok.headers["x-ratelimit-limit-requests"] == "5", ok.headers
            assert_openai_error(generate(shim, "http", "key-two"), 403, "permission_error", "model_not_allowed",
                                "model")
            assert_openai_error(generate(shim, "http", None), 401, "authentication_error", "invalid_api_key")
        finally:
            shim.stop()
            assert_no_panic(shim)
            shim.remove_log()
    finally:
        service.stop()
        assert_no_panic(service)
        service.remove_log()


def test_keys_hash_reads_standard_input():
    p = subprocess.run([str(harness.GYRE_BIN), "keys", "hash"], input="from-stdin\n", capture_output=True,
                       text=True, timeout=60, check=True)
    assert p.stdout.strip() == hashlib.sha256(b"from-stdin").hexdigest()
