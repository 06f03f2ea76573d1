"""Every bad input of the OpenAI surface is a 400 naming its `param`, in the
OpenAI error shape (validated against the spec), streaming or not, and always
before any SSE byte; and the statuses beyond 400 that gyre's own behaviour
produces end to end: 422 for a valid chat request to a model without a chat
template (gRPC FAILED_PRECONDITION). The mapping of every other gRPC code
(403, 409, 501, 504, ...) is tested through the router against a fake service
in shim/tests/http_api.rs."""

from __future__ import annotations

import json
import shutil

import pytest

import harness
import openai_schema
from conftest import QWEN

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "hi"}]

# (endpoint, body fields, param)
CASES = [
    (CHAT, {"temperature": 2.5}, "temperature"),
    (COMPLETIONS, {"temperature": -0.1}, "temperature"),
    (CHAT, {"top_p": -0.5}, "top_p"),
    (COMPLETIONS, {"top_p": 1.5}, "top_p"),
    (CHAT, {"presence_penalty": 2.5}, "presence_penalty"),
    (COMPLETIONS, {"frequency_penalty": -3}, "frequency_penalty"),
    (CHAT, {"n": 0}, "n"),
    (COMPLETIONS, {"n": 129}, "n"),
    (CHAT, {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    (CHAT, {"top_logprobs": 3}, "top_logprobs"),
    (COMPLETIONS, {"logprobs": 21}, "logprobs"),
    (CHAT, {"logit_bias": {"5": 100.5}}, "logit_bias"),
    (COMPLETIONS, {"logit_bias": {"999999999": 1}}, "logit_bias"),
    (CHAT, {"max_tokens": -1}, "max_tokens"),
    (COMPLETIONS, {"max_tokens": 0}, "max_tokens"),
    (CHAT, {"max_completion_tokens": -5}, "max_completion_tokens"),
    (COMPLETIONS, {"prompt": [999999999]}, "prompt"),
    (COMPLETIONS, {"prompt": [[1, 2], [999999999]]}, "prompt"),
    (COMPLETIONS, {"prompt": ""}, "prompt"),
    (COMPLETIONS, {"prompt": []}, "prompt"),
    (CHAT, {"messages": []}, "messages"),
    (CHAT, {"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    (CHAT, {"stop": [f"s{i}" for i in range(17)]}, "stop"),
    (COMPLETIONS, {"stop": [""]}, "stop"),
    (COMPLETIONS, {"suffix": "the end"}, "suffix"),
    (COMPLETIONS, {"length_penalty": 0.5}, "length_penalty"),
    (CHAT, {"max_tokens": 100000}, "max_tokens"),
]


def error_of(reply: harness.HttpReply, status: int) -> dict:
    assert reply.status == status, f"expected HTTP {status}, got {reply.status}: {reply.body[:500]!r}"
    assert b"data:" not in reply.body, "the error must come before any SSE event"
    body = reply.json()
    openai_schema.validate(openai_schema.ERROR, body)
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("path,fields,param", CASES, ids=[f"{p.rsplit('/', 1)[1]}-{c}-{i}"
                                                          for i, (p, _, c) in enumerate(CASES)])
def test_bad_input_is_400_naming_the_param(qwen, path, fields, param, stream):
    body = {"model": QWEN, "max_tokens": 2, "stream": stream,
            **({"messages": MESSAGES} if path == CHAT else {"prompt": "hi"}), **fields}
    err = error_of(harness.http_json(qwen.http, path, body), 400)
    assert (err["type"], err["param"]) == ("invalid_request_error", param), err


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_errors_name_the_field_as_sent(qwen, stream):
    # max_completion_tokens travels as the proto's max_tokens.
    body = {"model": QWEN, "stream": stream, "messages": MESSAGES, "max_completion_tokens": 0}
    err = error_of(harness.http_json(qwen.http, CHAT, body), 400)
    assert err["param"] == "max_completion_tokens" and "max_completion_tokens" in err["message"], err
    # A prompt longer than the context, no max_tokens sent: the prompt is at
    # fault, not a max_tokens the client never chose.
    limit = harness.http_json(qwen.http, "/tokenize", {"model": QWEN, "prompt": "hi"}).json()["max_model_len"]
    long = "hi " * (limit + 10)
    for path, fields, param in ((COMPLETIONS, {"prompt": long}, "prompt"),
                                (CHAT, {"messages": [{"role": "user", "content": long}]}, "messages")):
        err = error_of(harness.http_json(qwen.http, path, {"model": QWEN, "stream": stream, **fields}), 400)
        assert (err["param"], err["code"]) == (param, "context_length_exceeded"), err
        assert "max_tokens" not in err["message"] and str(limit) in err["message"], err


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_an_unknown_role_is_checked_by_the_service_and_clipped(qwen, stream):
    """Roles are checked once, by the service (gRPC clients get the same answer); over HTTP the error names the
    OpenAI param and quotes the role clipped."""
    body = {"model": QWEN, "max_tokens": 2, "stream": stream, "messages": [{"role": "r" * 20000, "content": "hi"}]}
    err = error_of(harness.http_json(qwen.http, CHAT, body), 400)
    assert (err["param"], err["code"]) == ("messages[0].role", "invalid_role"), err
    assert "r" * 100 in err["message"] and len(err["message"]) < 2000, err
    grpc = harness.buf_curl(qwen.grpc, "gyre.v1.Generation/GenerateStream",
                            {"model": QWEN, "chat": {"messages": [{"role": "robot", "content": "hi"}]}, "maxTokens": 2})
    assert grpc.rc != 0 and grpc.error and grpc.error["code"] == "invalid_argument", grpc
    assert "unknown role" in grpc.error["message"], grpc.error


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_stream_options_without_stream_is_400(qwen, path):
    body = {"model": QWEN, "messages": MESSAGES, "prompt": "hi", "max_tokens": 2,
            "stream_options": {"include_usage": True}}
    err = error_of(harness.http_json(qwen.http, path, body), 400)
    assert err["param"] == "stream_options"
    ok = harness.http_sse(qwen.http, path, {**body, "stream": True})
    assert ok.status == 200 and ok.done


def test_body_over_the_limit_is_413(qwen):
    body = json.dumps({"model": QWEN, "prompt": "x" * (5 * 1024 * 1024), "max_tokens": 1})
    err = error_of(harness.http_request(qwen.http, "POST", COMPLETIONS, body), 413)
    assert err["type"] == "invalid_request_error"


@pytest.fixture(scope="module")
def untemplated(start_server, tmp_path_factory):
    """A copy of tiny-qwen2 whose tokenizer config has no chat template."""
    src = harness.model_dir(QWEN)
    dst = tmp_path_factory.mktemp("models") / "no-template"
    dst.mkdir()
    for f in src.iterdir():
        if f.name == "tokenizer_config.json":
            cfg = json.loads(f.read_text())
            cfg.pop("chat_template", None)
            (dst / f.name).write_text(json.dumps(cfg))
        elif f.name != "chat_template.jinja":
            (dst / f.name).symlink_to(f)
    return start_server(str(dst))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_chat_without_a_chat_template_is_422(untemplated, stream):
    body = {"model": "no-template", "messages": MESSAGES, "max_tokens": 2, "stream": stream}
    err = error_of(harness.http_json(untemplated.http, CHAT, body), 422)
    assert (err["type"], err["code"], err["param"]) == ("invalid_request_error", "no_chat_template", "messages")
    # Text input still works on that model.
    ok = harness.http_json(untemplated.http, COMPLETIONS, {"model": "no-template", "prompt": "hi", "max_tokens": 2})
    assert ok.status == 200, ok.body
