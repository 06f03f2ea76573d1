"""Structured request logs: with `--log-format json`, each finished request
writes one `gyre::request` line (the service: request id, tenant, model,
method, status, latency, tokens in and out, finish reason) and each HTTP
request one `gyre::http` line (request id, method, route, status, latency).
Prompts and outputs appear only with `--log-prompts`. Embeddings, Responses
requests and each request on the bidi `Generate` stream have their
`gyre::request` line too."""

from __future__ import annotations

import json
import sys
import time

import grpc

import harness
from conftest import QWEN

sys.path.insert(0, str(harness.REPO / "clients" / "python"))
from gyre.v1 import generate_pb2 as pb  # noqa: E402
from gyre.v1 import generate_pb2_grpc as pb_grpc  # noqa: E402

EMBED = "all-minilm-l6-v2"

SECRET = "zebra quartz marmalade"


def log_line(server: harness.Server, target: str, request_id: str, timeout: float = 15.0) -> dict:
    """The JSON log line of `target` for `request_id` (written when the
    request ends, which may be just after the client has its answer)."""
    deadline = time.monotonic() + timeout
    while True:
        for line in server.stderr().splitlines():
            if request_id in line:
                event = json.loads(line)
                if event["target"] == target and event["fields"].get("request_id") == request_id:
                    return event
        assert time.monotonic() < deadline, f"no {target} line for {request_id}:\n{server.stderr()[-4000:]}"
        time.sleep(0.05)


def chat(server: harness.Server, request_id: str) -> dict:
    body = {"model": QWEN, "messages": [{"role": "user", "content": f"Say {SECRET}"}], "max_tokens": 4}
    reply = harness.http_json(server.http, "/v1/chat/completions", body, headers={"X-Request-Id": request_id})
    assert reply.status == 200, reply.body
    return reply.json()


def test_one_json_line_per_request_without_prompts(module_server):
    server = module_server(QWEN, "--log-format", "json")
    answer = chat(server, "log-plain")
    req = log_line(server, "gyre::request", "log-plain")
    f = req["fields"]
    assert req["level"] == "INFO" and f["message"] == "request finished"
    assert f["tenant"] == "anonymous" and f["model"] == QWEN
    assert f["method"] == "gyre.v1.Generation/GenerateStream" and f["status"] == "Ok"
    assert f["input_tokens"] == answer["usage"]["prompt_tokens"]
    assert f["output_tokens"] == answer["usage"]["completion_tokens"]
    assert f["finish_reason"] == answer["choices"][0]["finish_reason"]
    assert isinstance(f["latency_ms"], float) and f["latency_ms"] > 0
    http = log_line(server, "gyre::http", "log-plain")["fields"]
    assert (http["method"], http["route"], http["status"]) == ("POST", "/v1/chat/completions", 200)
    assert http["completed"] is True and isinstance(http["latency_ms"], float) and http["latency_ms"] > 0
    # Neither the prompt nor the output is anywhere in the log.
    log = server.stderr()
    assert SECRET not in log
    assert "prompt" not in f and "output" not in f
    # An error is logged with its status and no tokens.
    bad = harness.http_json(server.http, "/v1/chat/completions",
                            {"model": "no-such", "messages": [{"role": "user", "content": "Hi"}]},
                            headers={"X-Request-Id": "log-refused"})
    assert bad.status == 404
    refused = log_line(server, "gyre::request", "log-refused")["fields"]
    assert refused["status"] == "NotFound" and refused["output_tokens"] == 0
    assert "no-such" in refused["error"]
    assert log_line(server, "gyre::http", "log-refused")["fields"]["status"] == 404


def test_log_prompts_puts_prompt_and_output_in_the_line(module_server):
    server = module_server(QWEN, "--log-format", "json", "--log-prompts")
    answer = chat(server, "log-prompts")
    f = log_line(server, "gyre::request", "log-prompts")["fields"]
    assert SECRET in f["prompt"]
    assert f["output"] == answer["choices"][0]["message"]["content"]


def test_embeddings_responses_and_bidi_generate_requests_each_log_a_line(module_server):
    server = module_server(QWEN, "--model", str(harness.model_dir(EMBED)), "--log-format", "json")
    embedded = harness.http_json(server.http, "/v1/embeddings", {"model": EMBED, "input": ["a cat", "a dog"]},
                                 headers={"X-Request-Id": "log-embed"})
    assert embedded.status == 200, embedded.body
    f = log_line(server, "gyre::request", "log-embed")["fields"]
    assert (f["method"], f["model"], f["status"]) == ("gyre.v1.Embeddings/Embed", EMBED, "Ok")
    assert f["input_tokens"] == embedded.json()["usage"]["prompt_tokens"] > 0
    assert f["output_tokens"] == 0

    created = harness.http_json(server.http, "/v1/responses",
                                {"model": QWEN, "input": f"Say {SECRET}", "max_output_tokens": 4},
                                headers={"X-Request-Id": "log-resp"})
    assert created.status == 200, created.body
    usage = created.json()["usage"]
    f = log_line(server, "gyre::request", "log-resp")["fields"]
    assert (f["method"], f["model"], f["status"]) == ("gyre.v1.Responses/Create", QWEN, "Ok")
    assert (f["input_tokens"], f["output_tokens"]) == (usage["input_tokens"], usage["output_tokens"])
    assert f["finish_reason"] in ("stop", "length")

    starts = [pb.GenerateRequest(start=pb.Request(request_id="log-bidi-1", model=QWEN, text="Once upon",
                                                  max_tokens=3, ignore_eos=True)),
              pb.GenerateRequest(start=pb.Request(request_id="log-bidi-2", model="no-such", text="Hi"))]
    with grpc.insecure_channel(server.grpc) as channel:
        events = list(pb_grpc.GenerationStub(channel).Generate(iter(starts)))
    [finish] = [e.finish for e in events if e.request_id == "log-bidi-1" and e.HasField("finish")]
    f = log_line(server, "gyre::request", "log-bidi-1")["fields"]
    assert (f["method"], f["model"], f["status"]) == ("gyre.v1.Generation/Generate", QWEN, "Ok")
    assert f["output_tokens"] == finish.usage.completion_tokens == 3
    assert f["finish_reason"] == "length" and f["tenant"] == "anonymous"
    refused = log_line(server, "gyre::request", "log-bidi-2")["fields"]
    assert refused["status"] == "NotFound" and "no-such" in refused["error"]
    assert SECRET not in server.stderr()
