"""The gyre.v1 gRPC API through `buf curl` (server reflection, no local protos).

Covers reflection, server-streaming `GenerateStream`, the multiplexed bidi
`Generate` stream (interleaved requests, per-request cancel, a failed start
that leaves its neighbours alone), grpc.health.v1 (overall, per service, per
model), Tokenize/Detokenize/ListModels, gRPC-Web over HTTP/1.1, a bad
sampling value, API-key enforcement on gRPC, and that the process loaded
libtorch_cuda.so (GPU readiness, checkable on a CPU-only machine).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import harness
from conftest import API_KEY, QWEN

GEN = "gyre.v1.Generation"


def events_by_id(messages: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for m in messages:
        out.setdefault(m["requestId"], []).append(m)
    return out


def check_request_events(events: list[dict]) -> dict:
    """Asserts deltas then exactly one final finish; returns the finish."""
    kinds = ["finish" if "finish" in e else "delta" if "delta" in e else "?" for e in events]
    assert kinds and kinds[-1] == "finish" and kinds.count("finish") == 1, kinds
    assert "?" not in kinds, events
    return events[-1]["finish"]


def generated_ids(events: list[dict]) -> list[int]:
    return [int(t) for e in events if "delta" in e for t in e["delta"].get("tokenIds", [])]


# --- reflection and health ------------------------------------------------


def test_reflection_lists_services_and_methods(qwen):
    services = harness.list_lines(qwen.grpc, "--list-services")
    assert GEN in services and "grpc.health.v1.Health" in services, services
    methods = harness.list_lines(qwen.grpc, "--list-methods")
    for m in ("Generate", "GenerateStream", "Tokenize", "Detokenize", "ListModels"):
        assert f"{GEN}/{m}" in methods, methods


@pytest.mark.parametrize("service", [None, GEN, QWEN])
def test_health_check_serving(qwen, service):
    body = {} if service is None else {"service": service}
    res = harness.buf_curl(qwen.grpc, "grpc.health.v1.Health/Check", body).ok()
    assert res.messages == [{"status": "SERVING"}]


def test_health_check_unknown_service_is_not_found(qwen):
    res = harness.buf_curl(qwen.grpc, "grpc.health.v1.Health/Check", {"service": "nope"})
    assert res.rc != 0 and res.error and res.error["code"] == "not_found", res.stderr


# --- unary calls ----------------------------------------------------------


def test_list_models(qwen):
    res = harness.buf_curl(qwen.grpc, f"{GEN}/ListModels", {}).ok()
    models = res.messages[0]["models"]
    (model,) = [m for m in models if m["id"] == QWEN]
    assert model["architecture"] == "Qwen2ForCausalLM"
    assert model["vocabSize"] == 151936
    assert model["maxModelLen"] > 0 and model["ownedBy"]


def test_tokenize_detokenize_round_trip(qwen):
    gold = harness.golden(QWEN)
    tok = harness.buf_curl(qwen.grpc, f"{GEN}/Tokenize", {"model": QWEN, "text": gold["prompt"]}).ok()
    ids = [int(t) for t in tok.messages[0]["tokenIds"]]
    assert ids == gold["prompt_ids"], "gyre's tokenizer must match transformers'"
    assert tok.messages[0]["maxModelLen"] > 0
    detok = harness.buf_curl(qwen.grpc, f"{GEN}/Detokenize", {"model": QWEN, "tokenIds": ids}).ok()
    assert detok.messages[0]["text"] == gold["prompt"]


def test_tokenize_chat_matches_template(qwen):
    render = next(r for r in harness.golden(QWEN)["chat_renders"] if "token_ids" in r)
    chat = {"messages": render["messages"], "addGenerationPrompt": render["add_generation_prompt"]}
    res = harness.buf_curl(qwen.grpc, f"{GEN}/Tokenize", {"model": QWEN, "chat": chat}).ok()
    assert res.messages[0]["prompt"] == render["text"]
    assert [int(t) for t in res.messages[0]["tokenIds"]] == render["token_ids"]


def test_grpc_web_list_models(qwen):
    res = harness.buf_curl(qwen.grpc, f"{GEN}/ListModels", {}, protocol="grpcweb").ok()
    assert QWEN in [m["id"] for m in res.messages[0]["models"]]


# --- GenerateStream -------------------------------------------------------


def test_generate_stream_text(qwen):
    req = {"model": QWEN, "text": "Hello there", "maxTokens": 6, "ignoreEos": True,
           "sampling": {"temperature": 0}}
    res = harness.buf_curl(qwen.grpc, f"{GEN}/GenerateStream", req).ok()
    assert len({m["requestId"] for m in res.messages}) == 1 and res.messages[0]["requestId"]
    finish = check_request_events(res.messages)
    assert finish["reason"] == "FINISH_REASON_LENGTH"
    assert finish["usage"]["completionTokens"] == 6
    assert finish["usage"]["promptTokens"] > 0
    assert len(generated_ids(res.messages)) == 6
    assert "".join(m["delta"].get("text", "") for m in res.messages if "delta" in m)


def test_generate_stream_bad_temperature_is_invalid_argument(qwen):
    req = {"model": QWEN, "text": "Hello", "maxTokens": 4, "sampling": {"temperature": 5}}
    res = harness.buf_curl(qwen.grpc, f"{GEN}/GenerateStream", req)
    assert res.rc != 0 and res.messages == []
    assert res.error and res.error["code"] == "invalid_argument", res.stderr


def test_generate_stream_unknown_model_is_not_found(qwen):
    res = harness.buf_curl(qwen.grpc, f"{GEN}/GenerateStream", {"model": "nope", "text": "Hi"})
    assert res.error and res.error["code"] == "not_found", res.stderr


# --- the bidi Generate stream ---------------------------------------------


def start(request_id: str, max_tokens: int, **kw) -> dict:
    req = {"requestId": request_id, "model": QWEN, "text": f"Request {request_id} says",
           "maxTokens": max_tokens, "ignoreEos": True}
    req.update(kw)
    return {"start": req}


def test_bidi_interleaved_with_cancel(qwen):
    msgs = [start("a", 40), start("b", 1500), {"cancel": {"requestId": "b"}}]
    res = harness.buf_curl(qwen.grpc, f"{GEN}/Generate", msgs).ok()
    by_id = events_by_id(res.messages)
    assert set(by_id) == {"a", "b"}, set(by_id)
    fin_a = check_request_events(by_id["a"])
    assert fin_a["reason"] == "FINISH_REASON_LENGTH"
    assert fin_a["usage"]["completionTokens"] == 40
    assert len(generated_ids(by_id["a"])) == 40
    fin_b = check_request_events(by_id["b"])
    assert fin_b["reason"] == "FINISH_REASON_CANCELLED", fin_b
    assert fin_b.get("usage", {}).get("completionTokens", 0) < 1500


def test_bidi_concurrent_requests_interleave_freely(qwen):
    # Two long-enough requests run side by side; events may interleave (not
    # required), but each request's own events are complete and ordered.
    msgs = [start("x", 24), start("y", 24)]
    res = harness.buf_curl(qwen.grpc, f"{GEN}/Generate", msgs).ok()
    by_id = events_by_id(res.messages)
    for rid in ("x", "y"):
        fin = check_request_events(by_id[rid])
        assert fin["reason"] == "FINISH_REASON_LENGTH" and fin["usage"]["completionTokens"] == 24
        assert len(generated_ids(by_id[rid])) == 24


def test_bidi_bad_start_fails_alone(qwen):
    msgs = [start("good", 8), start("bad", 8, model="nope")]
    res = harness.buf_curl(qwen.grpc, f"{GEN}/Generate", msgs).ok()
    by_id = events_by_id(res.messages)
    bad = check_request_events(by_id["bad"])
    assert bad["reason"] == "FINISH_REASON_ERROR"
    assert bad["error"]["code"] == 5, bad  # NOT_FOUND
    assert bad["error"].get("message")
    good = check_request_events(by_id["good"])
    assert good["reason"] == "FINISH_REASON_LENGTH" and good["usage"]["completionTokens"] == 8


def test_bidi_bad_temperature_fails_alone(qwen):
    msgs = [start("t", 2, sampling={"temperature": 5}), start("ok", 2)]
    res = harness.buf_curl(qwen.grpc, f"{GEN}/Generate", msgs).ok()
    by_id = events_by_id(res.messages)
    bad = check_request_events(by_id["t"])
    assert bad["reason"] == "FINISH_REASON_ERROR" and bad["error"]["code"] == 3, bad  # INVALID_ARGUMENT
    assert check_request_events(by_id["ok"])["reason"] == "FINISH_REASON_LENGTH"


# --- authentication -------------------------------------------------------


def test_grpc_api_key(keyed):
    body = {"model": QWEN, "text": "Hi", "maxTokens": 2}
    res = harness.buf_curl(keyed.grpc, f"{GEN}/GenerateStream", body)
    assert res.rc != 0 and res.error and res.error["code"] == "unauthenticated", res.stderr
    res = harness.buf_curl(keyed.grpc, f"{GEN}/ListModels", {}, headers=["Authorization: Bearer wrong"])
    assert res.error and res.error["code"] == "unauthenticated", res.stderr

    ok = harness.buf_curl(keyed.grpc, f"{GEN}/GenerateStream", body,
                          headers=[f"Authorization: Bearer {API_KEY}"]).ok()
    assert check_request_events(ok.messages)["reason"] == "FINISH_REASON_LENGTH"
    # Health and reflection (used by buf curl itself) need no key.
    health = harness.buf_curl(keyed.grpc, "grpc.health.v1.Health/Check", {}).ok()
    assert health.messages == [{"status": "SERVING"}]


# --- process --------------------------------------------------------------


def test_process_loaded_libtorch_cuda(qwen):
    maps = Path(f"/proc/{qwen.pid}/maps").read_text()
    assert any(line.rstrip().endswith("libtorch_cuda.so") for line in maps.splitlines()), (
        "gyre did not load libtorch_cuda.so: it would not see a GPU (link it with --no-as-needed)"
    )
