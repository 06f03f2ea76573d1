"""Property-based fuzzing of the OpenAI HTTP API with schemathesis.

The OpenAPI document is the one the other tests validate against
(`openai_schema`, with its `nullable` rewrite), cut down to the operations
gyre implements: `createChatCompletion`, `createCompletion`, `listModels`
and `retrieveModel`. Schemathesis generates requests from it, positive
(valid per OpenAI's schema) and negative (violating it), and each one is
sent to a real `gyre serve` on the tiny Qwen2 fixture model. For every
response:

- no 5xx, and no `server_error` event inside a stream;
- a 2xx JSON body matches the operation's response schema; a streamed body
  is SSE whose chunks match the chunk schema and that ends with `[DONE]`
  (or with an error event in the OpenAI shape);
- any other status is a 4xx whose body is the OpenAI error shape, all four
  keys present;
- the server logged no ERROR line and did not panic while serving it.

Failures are collected, not raised at the first one, so one run lists every
distinct kind of failure with a curl command that reproduces it.

Bounds that keep the module within a few minutes on two cores: an integer
`max_tokens` / `max_completion_tokens` above 16 is reduced modulo 17 (a
body with neither gets `max_completion_tokens: 8`), and an integer `n`
above 4 is reduced modulo 5 (whole-number floats alike, keeping their type). Values that are not integers are left as
generated, so type errors are still fuzzed. Three cases in four have their
string `model` replaced with the served model's id, so most requests reach
generation instead of stopping at "model not found".

Reproducible: Hypothesis runs derandomized (a fixed seed per test) with no
example database, and schemathesis never contacts anything but the server.
"""

from __future__ import annotations

import copy
import json
import os
import re
from dataclasses import dataclass, field

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

import harness
import openai_schema
from conftest import QWEN

#: operationId -> (path, method, response schema of a 2xx JSON body, of a stream chunk).
OPERATIONS = {
    "createChatCompletion": ("/chat/completions", "post", openai_schema.CHAT, openai_schema.CHAT_CHUNK),
    "createCompletion": ("/completions", "post", openai_schema.COMPLETION, openai_schema.COMPLETION_CHUNK),
    "listModels": ("/models", "get", openai_schema.MODEL_LIST, None),
    "retrieveModel": ("/models/{model}", "get", openai_schema.MODEL, None),
}

#: (operationId, mode, cases): 300 to 400 per operation. listModels has no
#: parameters; its cases vary the `Authorization` header (the document's
#: bearer scheme), which a key-less server passes on to the gRPC service.
RUNS = [
    ("createChatCompletion", GenerationMode.POSITIVE, 250),
    ("createChatCompletion", GenerationMode.NEGATIVE, 150),
    ("createCompletion", GenerationMode.POSITIVE, 250),
    ("createCompletion", GenerationMode.NEGATIVE, 150),
    ("listModels", GenerationMode.POSITIVE, 300),
    ("retrieveModel", GenerationMode.POSITIVE, 200),
    ("retrieveModel", GenerationMode.NEGATIVE, 100),
]

#: `GYRE_FUZZ_SCALE=4` runs four times as many cases (or 0.1 a tenth).
SCALE = float(os.environ.get("GYRE_FUZZ_SCALE", "1"))

MAX_TOKENS_CAP = 16
N_CAP = 4
LOG_ERROR = re.compile(r"^\S+\s+ERROR\s", re.MULTILINE)
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _refs(node, out: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/"):
            out.add(ref)
        for v in node.values():
            _refs(v, out)
    elif isinstance(node, list):
        for v in node:
            _refs(v, out)


def implemented_spec() -> dict:
    """The OpenAI document with only gyre's operations and what they reference."""
    full = openai_schema._spec()
    paths: dict = {}
    for path, method, _, _ in OPERATIONS.values():
        paths.setdefault(path, {})[method] = copy.deepcopy(full["paths"][path][method])
    components: dict = {}
    seen: set[str] = set()
    todo: set[str] = set()
    _refs(paths, todo)
    while todo:
        ref = todo.pop()
        if ref in seen:
            continue
        seen.add(ref)
        _, _, kind, name = ref.split("/", 3)
        node = copy.deepcopy(full["components"][kind][name])
        components.setdefault(kind, {})[name] = node
        _refs(node, todo)
    components["securitySchemes"] = copy.deepcopy(full["components"]["securitySchemes"])
    return {
        "openapi": full["openapi"],
        "info": full["info"],
        "servers": [{"url": "http://127.0.0.1/v1"}],
        "security": full.get("security", []),
        "paths": paths,
        "components": components,
    }


@dataclass
class Findings:
    """Failures found so far, one reproducer per distinct kind."""

    kinds: dict[str, str] = field(default_factory=dict)
    count: int = 0

    def add(self, kind: str, detail: str) -> None:
        self.count += 1
        self.kinds.setdefault(kind, detail)


@pytest.fixture(scope="module")
def server():
    """A `gyre serve` of its own, so its log holds only the fuzzed traffic."""
    srv = harness.serve(QWEN)
    yield srv
    srv.stop()
    log = srv.stderr()
    srv.remove_log()
    assert "panicked" not in log, f"gyre panicked under fuzzing; stderr:\n{log[-4000:]}"


@pytest.fixture(scope="module")
def schema():
    # Streams are read whole (schemathesis stops after 20 events by default).
    config = schemathesis.Config.from_dict({"max-stream-events": 1_000_000})
    return schemathesis.openapi.from_dict(implemented_spec(), config=config)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def bound(body) -> None:
    """Keeps generations short (see the module docstring); in place."""
    if not isinstance(body, dict):
        return
    capped = False
    for key in ("max_tokens", "max_completion_tokens"):
        v = body.get(key)
        if _number(v):
            if v > MAX_TOKENS_CAP:
                # Whole-number floats too (`8.0` may be accepted as 8); the type is kept.
                body[key] = v % (MAX_TOKENS_CAP + 1)
            capped = True
        elif v is not None:
            capped = True  # a wrong type: the request is refused before generating
    if not capped:
        body["max_completion_tokens"] = 8
    n = body.get("n")
    if _number(n) and n > N_CAP:
        body["n"] = n % (N_CAP + 1)


def shape(case, real_model: bool, served: str) -> None:
    """Bounds the case and, when `real_model`, aims it at the served model."""
    if isinstance(case.body, dict):
        bound(case.body)
        if real_model and isinstance(case.body.get("model"), str):
            case.body["model"] = served
    if real_model and case.path_parameters and "model" in case.path_parameters:
        case.path_parameters["model"] = served


def _json(body: bytes):
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise AssertionError(f"body is not JSON ({e}): {body[:300]!r}") from None


def check_error_body(body) -> None:
    openai_schema.validate(openai_schema.ERROR, body)
    assert set(body["error"]) == {"message", "type", "param", "code"}, f"error keys: {sorted(body['error'])}"


def check_stream(raw: bytes, chunk_schema: str | None) -> None:
    assert chunk_schema is not None, "an SSE answer from an operation that does not stream"
    events = harness.parse_sse(raw)
    assert events, "an empty event stream"
    for i, event in enumerate(events):
        if event == "[DONE]":
            assert i == len(events) - 1, "events after [DONE]"
            return
        chunk = _json(event.encode())
        if "error" in chunk:
            check_error_body(chunk)
            assert chunk["error"]["type"] != "server_error", f"server error inside the stream: {chunk}"
            assert i == len(events) - 1, "events after an error event"
            return
        openai_schema.validate(chunk_schema, chunk)
    raise AssertionError("the stream ended without [DONE] or an error event")


def check_response(op_id: str, status: int, headers: dict, raw: bytes) -> str | None:
    """None when the response is acceptable, else the kind of failure."""
    _, _, body_schema, chunk_schema = OPERATIONS[op_id]
    ctype = headers.get("content-type", "")
    try:
        if status >= 500:
            return f"HTTP {status}"
        if 200 <= status < 300:
            if ctype.startswith("text/event-stream"):
                check_stream(raw, chunk_schema)
            else:
                assert ctype.startswith("application/json"), f"content type {ctype!r}"
                openai_schema.validate(body_schema, _json(raw))
        else:
            assert 400 <= status < 500, f"status {status}"
            assert ctype.startswith("application/json"), f"error content type {ctype!r}"
            check_error_body(_json(raw))
    except (AssertionError, ValueError) as e:
        first = str(e).splitlines()[0] if str(e) else "assertion"
        return f"HTTP {status}: {first[:200]}"
    return None


def new_log_lines(srv: harness.Server, offset: int) -> tuple[str, int]:
    text = srv.stderr()
    return ANSI.sub("", text[offset:]), len(text)


def reproducer(case, base_url: str) -> str:
    if isinstance(case.body, (bytes, bytearray)):
        body = repr(bytes(case.body))
    elif isinstance(case.body, (dict, list, str, int, float, bool)) or case.body is None:
        body = json.dumps(case.body)
    else:
        body = ""  # no body (schemathesis' NOT_SET)
    curl = case.as_curl_command(base_url=base_url)
    return f"{curl}\n  body: {body[:1500]}"


@pytest.mark.parametrize("op_id,mode,cases", RUNS, ids=[f"{o}-{m.value}" for o, m, _ in RUNS])
def test_fuzz_operation(server, schema, op_id, mode, cases):
    path, method, _, _ = OPERATIONS[op_id]
    operation = schema[path][method.upper()]
    base_url = f"http://{server.http}/v1"
    findings = Findings()
    log_offset = [len(server.stderr())]
    sent = [0]
    unsendable = [0]
    statuses: dict[int, int] = {}

    @settings(
        max_examples=max(1, round(cases * SCALE)),
        derandomize=True,
        database=None,
        deadline=None,
        phases=(Phase.explicit, Phase.generate),
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @given(case=operation.as_strategy(generation_mode=mode), pick=st.integers(0, 3))
    def run(case, pick):
        shape(case, real_model=pick != 0, served=QWEN)
        try:
            resp = case.call(base_url=base_url, timeout=120)
        except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as e:
            # The server closed, reset, cut or never answered the connection.
            sent[0] += 1
            findings.add(f"transport: {type(e).__name__}", f"{e}\n{reproducer(case, base_url)}")
            return
        except (requests.RequestException, UnicodeError, ValueError):
            # Refused by the client library before sending (e.g. a generated
            # header value HTTP cannot carry): nothing reached the server.
            unsendable[0] += 1
            return
        sent[0] += 1
        statuses[resp.status_code] = statuses.get(resp.status_code, 0) + 1
        headers = {k.lower(): (v[0] if isinstance(v, list) and v else v) for k, v in resp.headers.items()}
        kind = check_response(op_id, resp.status_code, headers, resp.content)
        if resp.is_truncated:
            kind = kind or "stream cut short by the client"
        lines, log_offset[0] = new_log_lines(server, log_offset[0])
        if kind is not None:
            findings.add(kind, f"{reproducer(case, base_url)}\n  answer: {resp.content[:600]!r}")
        log_findings(lines, lambda: reproducer(case, base_url))

    def log_findings(lines: str, where) -> None:
        logged = [ln for ln in lines.splitlines() if LOG_ERROR.match(ln) or "panicked" in ln]
        if logged:
            first = logged[0].split("ERROR", 1)[-1].strip()
            findings.add(f"server log: {first[:160]}", f"{where()}\n  log: {chr(10).join(logged)[:1500]}")

    run()
    # Anything logged after the last answer was sent.
    log_findings(new_log_lines(server, log_offset[0])[0], lambda: "after the last case")
    print(f"{op_id} ({mode.value}): {sent[0]} sent, statuses {dict(sorted(statuses.items()))}")
    assert server.alive(), f"gyre died under fuzzing; stderr:\n{server.stderr()[-4000:]}"
    assert sent[0] > unsendable[0], f"only {sent[0]} cases sent, {unsendable[0]} refused by the client library"
    assert any(200 <= code < 300 for code in statuses), f"no case was served: {statuses}"
    report = "\n\n".join(f"[{kind}]\n{detail}" for kind, detail in findings.kinds.items())
    assert not findings.kinds, (
        f"{op_id} ({mode.value}): {findings.count} of {sent[0]} cases failed, "
        f"{len(findings.kinds)} kinds:\n\n{report}"
    )


def test_checks_catch_bad_responses():
    """The response checks above are not vacuous: each kind of bad answer is caught."""
    ok_error = json.dumps({"error": {"message": "m", "type": "invalid_request_error", "param": None,
                                     "code": None}}).encode()
    json_ct = {"content-type": "application/json"}
    sse_ct = {"content-type": "text/event-stream"}
    assert check_response("createChatCompletion", 400, json_ct, ok_error) is None
    assert check_response("createChatCompletion", 500, json_ct, ok_error) == "HTTP 500"
    no_code = json.dumps({"error": {"message": "m", "type": "t", "param": None}}).encode()
    assert check_response("createCompletion", 400, json_ct, no_code) is not None
    assert check_response("listModels", 200, json_ct, b'{"object": "list"}') is not None
    assert check_response("retrieveModel", 404, {"content-type": "text/plain"}, b"no") is not None
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}]}
    good = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
    assert check_response("createChatCompletion", 200, sse_ct, good) is None
    cut = f"data: {json.dumps(chunk)}\n\n".encode()
    assert check_response("createChatCompletion", 200, sse_ct, cut) is not None
    server_error = json.dumps({"error": {"message": "m", "type": "server_error", "param": None, "code": None}})
    assert check_response("createChatCompletion", 200, sse_ct, f"data: {server_error}\n\n".encode()) is not None
    assert LOG_ERROR.search(ANSI.sub("", "2026-01-01T00:00:00Z \x1b[31mERROR\x1b[0m gyre: boom\n"))
    assert not LOG_ERROR.search("2026-01-01T00:00:00Z  INFO gyre: an ERROR in a message\n")
