"""A real OTLP trace receiver for the tests: a gRPC server on a loopback
port implementing `opentelemetry.proto.collector.trace.v1.TraceService`
(the protobuf classes from the `opentelemetry-proto` package), keeping every
span it is sent, flattened with its resource's attributes."""

from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import dataclass

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as svc_pb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as svc_grpc
from opentelemetry.proto.trace.v1 import trace_pb2


def _value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def attributes(kvs) -> dict:
    return {kv.key: _value(kv.value) for kv in kvs}


@dataclass
class Span:
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root span
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attrs: dict
    resource: dict


SERVER = trace_pb2.Span.SpanKind.SPAN_KIND_SERVER
INTERNAL = trace_pb2.Span.SpanKind.SPAN_KIND_INTERNAL


class _Collector(svc_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.cond = threading.Condition()

    def Export(self, request, context):  # noqa: N802 (gRPC's name)
        got = []
        for rs in request.resource_spans:
            resource = attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(Span(s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.name,
                                    s.kind, s.start_time_unix_nano, s.end_time_unix_nano,
                                    attributes(s.attributes), resource))
        with self.cond:
            self.spans.extend(got)
            self.cond.notify_all()
        return svc_pb.ExportTraceServiceResponse()


class Receiver:
    """Start with `Receiver()`, point `--otlp-endpoint` at `endpoint`, stop with `close()`."""

    def __init__(self) -> None:
        self._collector = _Collector()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        svc_grpc.add_TraceServiceServicer_to_server(self._collector, self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        self.endpoint = f"http://127.0.0.1:{port}"

    def wait_for(self, trace_id: str, names: set[str], timeout: float = 15.0) -> list[Span]:
        """The spans of `trace_id`, once all of `names` are among them
        (fails after `timeout` seconds with what did arrive)."""
        deadline = time.monotonic() + timeout
        with self._collector.cond:
            while True:
                spans = [s for s in self._collector.spans if s.trace_id == trace_id]
                if names <= {s.name for s in spans}:
                    return spans
                left = deadline - time.monotonic()
                if left <= 0:
                    got = sorted(s.name for s in spans)
                    raise AssertionError(f"spans {sorted(names)} of trace {trace_id} not all received; got {got}")
                self._collector.cond.wait(left)

    def close(self) -> None:
        self._server.stop(grace=None)
