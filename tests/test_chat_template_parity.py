"""Every chat template in tests/data/chat-templates renders byte for byte
as transformers' `apply_chat_template` renders it, over the conversation
matrix of `chat_template_matrix` (tools, tool calls and results, parallel
calls, multi-turn, system or not, add_generation_prompt on and off,
continue_final_message, chat_template_kwargs, reasoning in history), and a
template that raises gives the template's own message.

The references are rendered here, in the test run, by transformers. gyre's
render comes back from gRPC `Tokenize` (its `prompt`), the case sent in
OpenAI wire form with the template as the request's `chat_template` to a
server started with --trust-request-chat-template. Templates that call
strftime_now are compared at the same (UTC) date on both sides; a render
that crosses midnight is re-rendered once.

Also through the HTTP API: `--chat-template <file>` replaces the model's
template, a template's raise_exception is a 400 carrying its message, content
parts and tool-call history normalise as documented, and request templates
are refused unless the server trusts them.
"""

from __future__ import annotations

import sys

import grpc
import pytest
from transformers import AutoTokenizer

import chat_template_matrix as matrix
import harness

sys.path.insert(0, str(harness.REPO / "clients" / "python"))
from gyre.v1 import generate_pb2 as pb  # noqa: E402
from gyre.v1 import generate_pb2_grpc as pb_grpc  # noqa: E402

MODEL = "tiny-qwen2"
NONE_LOOP = "TypeError: 'NoneType' object is not iterable"
NO_TOOLS_CASES = {name for name, (_, opts) in matrix.CASES.items() if not opts.get("tools")}


@pytest.fixture(scope="module")
def reference():
    return matrix.reference_renderer()


@pytest.fixture(scope="module")
def trusting(start_server):
    """tiny-qwen2 served with --trust-request-chat-template, and a gRPC stub."""
    server = start_server(MODEL, "--trust-request-chat-template")
    channel = grpc.insecure_channel(server.grpc)
    yield server, pb_grpc.GenerationStub(channel)
    channel.close()


def gyre_render(stub, template: str, case: str) -> tuple[str, str]:
    req = pb.TokenizeRequest(model=MODEL, chat=matrix.grpc_chat_input(pb, template, case))
    try:
        return "ok", stub.Tokenize(req, timeout=60).prompt
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (case, e.code(), e.details())
        return "error", e.details()


def explain(case: str, want: tuple[str, str], got: tuple[str, str]) -> str:
    return f"case {case!r}:\n  transformers: {want!r}\n  gyre:         {got!r}"


@pytest.mark.parametrize("template", matrix.template_names())
def test_template_renders_like_transformers(template, reference, trusting):
    _, stub = trusting
    diffs = []
    rendered = 0
    for case in matrix.CASES:
        want = reference(template, case)
        got = gyre_render(stub, template, case)
        if got[1] != want[1] and matrix.uses_clock(template):
            want = reference(template, case)  # the date may have changed in between
        if want[0] == "ok":
            rendered += 1
            ok = got == want
        elif want[0] == "raised":
            ok = got == ("error", want[1])
        elif want[1] == NONE_LOOP:
            # The one leniency (README): minijinja loops over none as over
            # an empty list, where Python raises.
            ok = got[0] == "error" or (got[0] == "ok" and case in NO_TOOLS_CASES)
        else:
            # Python itself failed (an undefined attribute used, a type
            # error): gyre must refuse the request too; minijinja words the
            # reason differently.
            ok = got[0] == "error"
        if not ok:
            diffs.append(explain(case, want, got))
    assert not diffs, f"{template}: {len(diffs)} of {len(matrix.CASES)} cases differ\n" + "\n".join(diffs)
    assert rendered >= 3, f"{template}: too few cases render at all ({rendered})"


def test_request_templates_need_trust(qwen):
    body = {"model": MODEL, "messages": [matrix.USER], "chat_template": "{{ messages[0].content }}"}
    reply = harness.http_json(qwen.http, "/tokenize", body)
    assert reply.status == 400, reply.body
    err = reply.json()["error"]
    assert "--trust-request-chat-template" in err["message"]
    assert err["param"] == "chat_template"


@pytest.fixture(scope="module")
def gemma2(start_server):
    """tiny-qwen2 with `--chat-template` pointing at Gemma 2's template."""
    path = harness.require_file(matrix.template_path("gemma-2-2b-it"), "the Gemma 2 template")
    return start_server(MODEL, "--chat-template", str(path))


def test_chat_template_flag_replaces_the_models_template(gemma2, reference):
    tok = AutoTokenizer.from_pretrained(harness.model_dir(MODEL))
    status, text = reference("gemma-2-2b-it", "multi-turn")
    assert status == "raised"  # Gemma 2 refuses system messages
    messages = [m for m in matrix.CASES["multi-turn"][0] if m["role"] != "system"]
    # The server's special tokens are tiny-qwen2's: no BOS text.
    want = tok.apply_chat_template(
        messages, chat_template=matrix.template_path("gemma-2-2b-it").read_text(), tokenize=False,
        add_generation_prompt=True, bos_token="")
    reply = harness.http_json(gemma2.http, "/tokenize", {"model": MODEL, "messages": messages})
    assert reply.status == 200, reply.body
    assert reply.json()["tokens"] == tok(want, add_special_tokens=False).input_ids
    assert "<start_of_turn>model\n" in want


def test_raise_exception_is_a_400_with_the_templates_message(gemma2, reference):
    status, message = reference("gemma-2-2b-it", "system+user")
    assert status == "raised" and message
    messages = matrix.CASES["system+user"][0]
    body = {"model": MODEL, "messages": messages, "max_tokens": 2}
    for stream in (False, True):
        reply = harness.http_json(gemma2.http, "/v1/chat/completions", {**body, "stream": stream})
        assert reply.status == 400, reply.body
        err = reply.json()["error"]
        assert err["message"] == message
        assert err["type"] == "invalid_request_error"


def test_wire_messages_normalise_as_documented(trusting, reference):
    """Over HTTP: content parts join with newlines, arguments JSON text (or
    an object) reaches the template as an object, content null stays null."""
    server, _ = trusting
    template = "qwen2.5-7b-instruct"
    source = matrix.template_path(template).read_text()
    tok = AutoTokenizer.from_pretrained(harness.model_dir(MODEL))
    parts = [{"role": "user", "content": [{"type": "text", "text": "Line one."},
                                          {"type": "text", "text": "Line two."}]}]
    joined = [{"role": "user", "content": "Line one.\nLine two."}]
    history = matrix.CASES["tool-call+result"][0]
    as_object = [dict(m) for m in history]
    as_object[1] = {**history[1], "tool_calls": [
        {**history[1]["tool_calls"][0], "function": {"name": "get_weather",
                                                     "arguments": {"city": "Paris", "unit": "celsius"}}}]}
    for sent, reference_input in ((parts, joined), (history, matrix.normalise(history)),
                                  (as_object, matrix.normalise(history))):
        want = tok.apply_chat_template(reference_input, chat_template=source, tokenize=False,
                                       add_generation_prompt=True)
        body = {"model": MODEL, "messages": sent, "chat_template": source}
        reply = harness.http_json(server.http, "/tokenize", body)
        assert reply.status == 200, reply.body
        assert reply.json()["tokens"] == tok(want, add_special_tokens=False).input_ids, sent
    bad = [dict(m) for m in history]
    bad[1] = {**history[1], "tool_calls": [{**history[1]["tool_calls"][0],
                                            "function": {"name": "get_weather", "arguments": "{oops"}}]}
    reply = harness.http_json(server.http, "/tokenize", {"model": MODEL, "messages": bad, "chat_template": source})
    assert reply.status == 400, reply.body
    assert reply.json()["error"]["param"] == "messages[1].tool_calls[0].function.arguments"
