"""OpenTelemetry traces end to end: `gyre serve --otlp-endpoint` pointed at a
real OTLP receiver (tests/otlp_receiver.py). One HTTP chat request that
carries a W3C `traceparent` must give one trace, the caller's: the shim's
HTTP span under the caller's span, the service's span under the shim's (the
link across the gRPC hop), the engine's spans under the service's, with the
GenAI attributes of the request and its answer. A direct gRPC call with
`traceparent` metadata continues the caller's trace the same way. Embeddings
and Responses requests over HTTP, and a request on the bidi `Generate`
stream, have their service span under the caller's too."""

from __future__ import annotations

import os
import secrets
import sys

import grpc
import pytest

import harness
from conftest import QWEN
from otlp_receiver import INTERNAL, SERVER, Receiver

sys.path.insert(0, str(harness.REPO / "clients" / "python"))
from gyre.v1 import generate_pb2 as pb  # noqa: E402
from gyre.v1 import generate_pb2_grpc as pb_grpc  # noqa: E402

ENGINE_SPANS = {"queue_wait", "prefill", "first_token", "decode", "detokenize"}
EMBED = "all-minilm-l6-v2"


@pytest.fixture(scope="module")
def traced():
    receiver = Receiver()
    argv = [str(harness.GYRE_BIN), "serve", "--model", str(harness.model_dir(QWEN)),
            "--model", str(harness.model_dir(EMBED)), "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0",
            "--otlp-endpoint", receiver.endpoint]
    # Export batches every 100 ms rather than the SDK's default 5 s.
    server = harness.Server.start(argv, env={**os.environ, "OTEL_BSP_SCHEDULE_DELAY": "100"})
    try:
        yield server, receiver
    finally:
        server.stop()
        receiver.close()
        log = server.stderr()
        assert "panicked" not in log, log[-4000:]


def caller_context() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def by_name(spans, name):
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, [s.name for s in spans])
    return found[0]


def check_engine_spans(spans, service):
    for name in ENGINE_SPANS:
        s = by_name(spans, name)
        assert s.parent_span_id == service.span_id, (name, s)
        assert s.kind == INTERNAL
        assert s.attrs["gen_ai.choice.index"] == 0
        assert service.start_ns <= s.start_ns <= s.end_ns <= service.end_ns, (name, s, service)
    queue, prefill, first, decode = (by_name(spans, n) for n in ("queue_wait", "prefill", "first_token", "decode"))
    assert queue.end_ns == prefill.start_ns
    assert first.start_ns == queue.start_ns and prefill.end_ns <= first.end_ns == decode.start_ns


def test_an_http_chat_request_is_one_trace_across_the_grpc_hop(traced):
    server, receiver = traced
    trace_id, caller_span, traceparent = caller_context()
    body = {"model": QWEN, "messages": [{"role": "user", "content": "Trace me"}],
            "max_tokens": 5, "temperature": 0.5}
    reply = harness.http_json(server.http, "/v1/chat/completions", body,
                              headers={"traceparent": traceparent, "X-Request-Id": "trace-http-1"})
    assert reply.status == 200, reply.body
    assert reply.headers["x-request-id"] == "trace-http-1"
    answer = reply.json()
    service_name = f"chat {QWEN}"
    spans = receiver.wait_for(trace_id, {"POST /v1/chat/completions", service_name, *ENGINE_SPANS})
    assert {s.trace_id for s in spans} == {trace_id}
    assert {s.resource.get("service.name") for s in spans} == {"gyre"}

    shim = by_name(spans, "POST /v1/chat/completions")
    assert shim.parent_span_id == caller_span and shim.kind == SERVER
    assert shim.attrs["http.route"] == "/v1/chat/completions"
    assert shim.attrs["http.response.status_code"] == 200
    assert shim.attrs["gyre.request_id"] == "trace-http-1"

    service = by_name(spans, service_name)
    assert service.parent_span_id == shim.span_id and service.kind == SERVER
    usage = answer["usage"]
    a = service.attrs
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == QWEN
    assert a["gen_ai.response.model"] == answer["model"] == QWEN
    assert a["gen_ai.request.max_tokens"] == 5
    assert a["gen_ai.request.temperature"] == pytest.approx(0.5)
    assert a["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert a["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert a["gen_ai.response.finish_reasons"] == [answer["choices"][0]["finish_reason"]]
    assert a["gen_ai.response.id"] == answer["id"]
    assert a["gyre.request_id"] == "trace-http-1"
    assert a["gyre.tenant"] == "anonymous"
    assert shim.start_ns <= service.start_ns
    check_engine_spans(spans, service)


def test_a_grpc_call_with_traceparent_continues_the_callers_trace(traced):
    server, receiver = traced
    trace_id, caller_span, traceparent = caller_context()
    with grpc.insecure_channel(server.grpc) as channel:
        stub = pb_grpc.GenerationStub(channel)
        call = stub.GenerateStream(
            pb.Request(model=QWEN, text="Once upon", max_tokens=3, ignore_eos=True),
            metadata=[("traceparent", traceparent)])
        events = list(call)
        returned = dict(call.initial_metadata())
    finish = events[-1].finish
    service_name = f"text_completion {QWEN}"
    spans = receiver.wait_for(trace_id, {service_name, *ENGINE_SPANS})
    assert {s.trace_id for s in spans} == {trace_id}
    service = by_name(spans, service_name)
    assert service.parent_span_id == caller_span
    assert service.attrs["gen_ai.operation.name"] == "text_completion"
    assert service.attrs["gen_ai.usage.output_tokens"] == finish.usage.completion_tokens == 3
    assert service.attrs["gen_ai.response.finish_reasons"] == ["length"]
    assert service.attrs["gen_ai.response.id"] == events[0].request_id
    # Without a client id the service made one, returned it and traced it.
    assert service.attrs["gyre.request_id"] == returned["x-request-id"]
    check_engine_spans(spans, service)


def test_a_refused_request_is_traced_with_its_error(traced):
    server, receiver = traced
    trace_id, caller_span, traceparent = caller_context()
    body = {"model": "no-such-model", "messages": [{"role": "user", "content": "Hi"}]}
    reply = harness.http_json(server.http, "/v1/chat/completions", body, headers={"traceparent": traceparent})
    assert reply.status == 404, reply.body
    service_name = "chat no-such-model"
    spans = receiver.wait_for(trace_id, {"POST /v1/chat/completions", service_name})
    service = by_name(spans, service_name)
    assert service.parent_span_id == by_name(spans, "POST /v1/chat/completions").span_id
    assert service.attrs["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]
    assert not ENGINE_SPANS & {s.name for s in spans}


def test_an_http_embeddings_request_has_its_service_span_under_the_shims(traced):
    server, receiver = traced
    trace_id, caller_span, traceparent = caller_context()
    reply = harness.http_json(server.http, "/v1/embeddings", {"model": EMBED, "input": ["a cat", "a dog"]},
                              headers={"traceparent": traceparent, "X-Request-Id": "trace-embed-1"})
    assert reply.status == 200, reply.body
    usage = reply.json()["usage"]
    service_name = f"embeddings {EMBED}"
    spans = receiver.wait_for(trace_id, {"POST /v1/embeddings", service_name})
    assert {s.trace_id for s in spans} == {trace_id}
    shim = by_name(spans, "POST /v1/embeddings")
    assert shim.parent_span_id == caller_span
    service = by_name(spans, service_name)
    assert service.parent_span_id == shim.span_id and service.kind == SERVER
    a = service.attrs
    assert a["gen_ai.operation.name"] == "embeddings"
    assert a["gen_ai.request.model"] == a["gen_ai.response.model"] == EMBED
    assert a["gen_ai.usage.input_tokens"] == usage["prompt_tokens"] > 0
    assert a["rpc.method"] == "gyre.v1.Embeddings/Embed"
    assert a["gyre.request_id"] == "trace-embed-1"
    assert not ENGINE_SPANS & {s.name for s in spans}


def test_an_http_responses_create_is_one_trace_with_engine_spans(traced):
    server, receiver = traced
    trace_id, caller_span, traceparent = caller_context()
    reply = harness.http_json(server.http, "/v1/responses",
                              {"model": QWEN, "input": "Trace this response", "max_output_tokens": 4},
                              headers={"traceparent": traceparent, "X-Request-Id": "trace-resp-1"})
    assert reply.status == 200, reply.body
    answer = reply.json()
    service_name = f"chat {QWEN}"
    spans = receiver.wait_for(trace_id, {"POST /v1/responses", service_name, *ENGINE_SPANS})
    shim = by_name(spans, "POST /v1/responses")
    assert shim.parent_span_id == caller_span
    service = by_name(spans, service_name)
    assert service.parent_span_id == shim.span_id
    a = service.attrs
    assert a["rpc.method"] == "gyre.v1.Responses/Create"
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.response.id"] == answer["id"]
    assert a["gen_ai.usage.input_tokens"] == answer["usage"]["input_tokens"]
    assert a["gen_ai.usage.output_tokens"] == answer["usage"]["output_tokens"]
    assert a["gyre.request_id"] == "trace-resp-1"
    check_engine_spans(spans, service)


def test_a_request_on_the_bidi_generate_stream_continues_the_callers_trace(traced):
    server, receiver = traced
    trace_id, caller_span, traceparent = caller_context()
    start = pb.GenerateRequest(start=pb.Request(request_id="bidi-trace-1", model=QWEN, text="Once upon",
                                                max_tokens=3, ignore_eos=True))
    with grpc.insecure_channel(server.grpc) as channel:
        events = list(pb_grpc.GenerationStub(channel).Generate(iter([start]),
                                                               metadata=[("traceparent", traceparent)]))
    finish = events[-1].finish
    assert finish.reason == pb.FINISH_REASON_LENGTH, events[-1]
    service_name = f"text_completion {QWEN}"
    spans = receiver.wait_for(trace_id, {service_name, *ENGINE_SPANS})
    service = by_name(spans, service_name)
    assert service.parent_span_id == caller_span
    a = service.attrs
    assert a["rpc.method"] == "gyre.v1.Generation/Generate"
    assert a["gyre.request_id"] == a["gen_ai.response.id"] == "bidi-trace-1"
    assert a["gen_ai.usage.output_tokens"] == finish.usage.completion_tokens == 3
    assert a["gen_ai.response.finish_reasons"] == ["length"]
    check_engine_spans(spans, service)


def test_a_standalone_shim_and_service_join_one_trace_from_the_environment():
    """`gyre grpc` and `gyre-shim` as two processes, each told the collector
    by `OTEL_EXPORTER_OTLP_ENDPOINT` alone; a streamed request."""
    receiver = Receiver()
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    service = harness.Server.start(
        [str(harness.GYRE_BIN), "grpc", "--model", str(harness.model_dir(QWEN)), "--grpc-addr", "127.0.0.1:0"],
        want=("gRPC",), env=env)
    shim = None
    try:
        shim = harness.Server.start(
            [str(harness.SHIM_BIN), "--grpc-endpoint", f"http://{service.grpc}", "--http-addr", "127.0.0.1:0"],
            want=("HTTP",), env=env)
        trace_id, caller_span, traceparent = caller_context()
        body = {"model": QWEN, "messages": [{"role": "user", "content": "Stream"}], "max_tokens": 4,
                "stream": True, "stream_options": {"include_usage": True}}
        reply = harness.http_sse(shim.http, "/v1/chat/completions", body, headers={"traceparent": traceparent})
        assert reply.status == 200 and reply.done
        usage = reply.chunks()[-1]["usage"]
        service_name = f"chat {QWEN}"
        spans = receiver.wait_for(trace_id, {"POST /v1/chat/completions", service_name, *ENGINE_SPANS})
        http_span = by_name(spans, "POST /v1/chat/completions")
        grpc_span = by_name(spans, service_name)
        assert http_span.parent_span_id == caller_span
        assert grpc_span.parent_span_id == http_span.span_id
        assert grpc_span.attrs["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
        assert grpc_span.attrs["gyre.request_id"] == http_span.attrs["gyre.request_id"] \
            == reply.headers["x-request-id"]
        check_engine_spans(spans, grpc_span)
    finally:
        if shim is not None:
            shim.stop()
        service.stop()
        receiver.close()
