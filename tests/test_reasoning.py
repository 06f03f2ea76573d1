"""Reasoning sections (`<think>...</think>`) split into `reasoning_content` /
`reasoning`, stream and non-stream, through the official SDK and gRPC.

The models have random weights, so their output is steered with `logit_bias`
(only the marker tokens can win) and with structured outputs. Every
expectation is derived from the same request's raw token ids (gRPC deltas,
decoded with `Detokenize`), never written down by hand.
"""

import json
import os
import re
import shutil
from pathlib import Path

import jsonschema
import openai
import pytest

import harness
import openai_schema

MODEL = "tiny-qwen2"
TEMPLATES = harness.REPO / "tests" / "data" / "chat-templates"
MESSAGES = [{"role": "user", "content": "Think, then answer."}]
# tiny-qwen2's pieces of "<think>" and "</think>".
START = [13708, 766, 29]  # "<th", "ink", ">"
END = [522, 26865, 29]  # "</", "think", ">"


def model_with_template(tmp: Path, template: str) -> Path:
    """tiny-qwen2's weights and tokenizer with a real chat template."""
    src = harness.model_dir(MODEL)
    dst = tmp / MODEL
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "tokenizer_config.json":
            os.symlink(f, dst / f.name)
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["chat_template"] = harness.require_file(TEMPLATES / template, template).read_text()
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    return dst


def start(tmp_path_factory, template: str, *flags: str):
    d = model_with_template(tmp_path_factory.mktemp("reasoning"), template)
    server = harness.Server.start([str(harness.GYRE_BIN), "serve", "--model", str(d),
                                   "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", *flags])
    return server, d


@pytest.fixture(scope="module")
def opened(tmp_path_factory):
    """The DeepSeek-R1 distill template: its generation prompt opens `<think>\\n`."""
    server, d = start(tmp_path_factory, "deepseek-r1-distill-qwen-32b.jinja")
    yield server
    server.stop()
    shutil.rmtree(d.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    """The Qwen3 template: the model itself starts with `<think>`."""
    server, d = start(tmp_path_factory, "qwen3-0.6b.jinja")
    yield server
    server.stop()
    shutil.rmtree(d.parent, ignore_errors=True)


def sdk(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{server.http}/v1", api_key="unused", max_retries=0, timeout=120)


def grpc_generate(server, body: dict) -> tuple[list[dict], dict]:
    """GenerateStream: (deltas, finish)."""
    req = {"model": MODEL, "chat": {"messages": MESSAGES}, **body}
    msgs = harness.buf_curl(server.grpc, "gyre.v1.Generation/GenerateStream", req).ok().messages
    deltas = [m["delta"] for m in msgs if "delta" in m]
    [finish] = [m["finish"] for m in msgs if "finish" in m]
    return deltas, finish


def detokenize(server, ids: list[int]) -> str:
    req = {"model": MODEL, "tokenIds": ids}
    [res] = harness.buf_curl(server.grpc, "gyre.v1.Generation/Detokenize", req).ok().messages
    return res.get("text", "")


def ids_of(deltas: list[dict]) -> list[int]:
    return [int(t) for d in deltas for t in d.get("tokenIds", [])]


def end_of(ids: list[int], marker: list[int]) -> int | None:
    """Index just past the first occurrence of `marker` in `ids`."""
    for i in range(len(ids) - len(marker) + 1):
        if ids[i:i + len(marker)] == marker:
            return i + len(marker)
    return None


def biased(seed: int, bias: list[int], **extra) -> dict:
    return {"temperature": 1.0, "seed": seed, "logit_bias": {str(t): 100 for t in bias}, **extra}


def test_prompt_opened_section_stream_nonstream_and_grpc_agree(opened):
    """R1 style: no start tag in the output; the end tag spans three tokens."""
    # A seed whose raw output closes the section (only marker pieces can win).
    for seed in range(30):
        deltas, finish = grpc_generate(opened, {"maxTokens": 60, "sampling": {
            "temperature": 1.0, "seed": seed, "logitBias": {str(t): 100 for t in END}}})
        ids = ids_of(deltas)
        cut = end_of(ids, END)
        if cut is not None and cut < len(ids):
            break
    else:
        pytest.fail("no seed closed the reasoning section")
    raw = detokenize(opened, ids)
    want_reasoning, want_content = raw.split("</think>", 1)
    # gRPC: typed fields, markup in neither, token ids untouched.
    assert "".join(d.get("reasoning", "") for d in deltas) == want_reasoning
    assert "".join(d.get("text", "") for d in deltas) == want_content
    assert finish["usage"]["reasoningTokens"] == cut
    # separate_reasoning=false: the raw text, markup included.
    raw_deltas, raw_finish = grpc_generate(opened, {"maxTokens": 60, "separateReasoning": False, "sampling": {
        "temperature": 1.0, "seed": seed, "logitBias": {str(t): 100 for t in END}}})
    assert ids_of(raw_deltas) == ids
    assert "".join(d.get("text", "") for d in raw_deltas) == raw
    assert "reasoningTokens" not in raw_finish["usage"]

    client = sdk(opened)
    full = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=60, **biased(seed, END))
    msg = full.choices[0].message
    assert msg.content == want_content
    assert msg.reasoning_content == want_reasoning == msg.reasoning
    assert full.usage.completion_tokens_details.reasoning_tokens == cut

    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=60, stream=True, stream_options={"include_usage": True},
        temperature=1.0, seed=seed, logit_bias={str(t): 100 for t in END})
    reasoning, content, usage = "", "", None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            d = c.delta.model_dump()
            if d.get("reasoning_content") is not None:
                assert d["reasoning"] == d["reasoning_content"]
                reasoning += d["reasoning_content"]
            content += d.get("content") or ""
    assert (reasoning, content) == (want_reasoning, want_content)
    assert usage.completion_tokens_details.reasoning_tokens == cut


def test_responses_validate_against_the_openai_spec(opened):
    payload = {"model": MODEL, "messages": MESSAGES, "max_tokens": 8, "temperature": 1.0, "seed": 3,
               "logit_bias": {str(t): 100 for t in END}}
    body = harness.http_json(opened.http, "/v1/chat/completions", payload).json()
    assert body["choices"][0]["message"]["reasoning_content"]
    openai_schema.validate(openai_schema.CHAT, body)
    reply = harness.http_sse(opened.http, "/v1/chat/completions",
                             {**payload, "stream": True, "stream_options": {"include_usage": True}})
    chunks = reply.chunks()
    assert any(c["choices"] and "reasoning_content" in c["choices"][0]["delta"] for c in chunks)
    for c in chunks:
        openai_schema.validate(openai_schema.CHAT_CHUNK, c)


def test_unfinished_section_is_all_reasoning(opened):
    """max_tokens inside the section: every token is reasoning, no content."""
    abc = 13683
    out = sdk(opened).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5,
                                              logit_bias={str(abc): 100})
    msg = out.choices[0].message
    assert out.choices[0].finish_reason == "length"
    assert msg.reasoning_content == "abc" * 5 and msg.content == ""
    assert out.usage.completion_tokens_details.reasoning_tokens == out.usage.completion_tokens == 5


def test_structured_output_applies_after_the_model_opened_section(qwen3):
    """Qwen3 style: the output may open `<think>` itself; the JSON schema
    applies from the token after `</think>`, the reasoning stays free."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    client = sdk(qwen3)
    for seed in range(3):
        out = client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=300, temperature=1.0, seed=seed,
            logit_bias={str(t): 100 for t in START + END},
            response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
        msg = out.choices[0].message
        assert out.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(msg.content), schema)
        # Free text made only of marker pieces, which JSON never allows.
        assert msg.reasoning_content and not re.fullmatch(r"[\s{}\"n:0-9-]*", msg.reasoning_content)
        assert "think" not in msg.content
        # The count is where the end marker's tokens end, per gRPC.
        deltas, finish = grpc_generate(qwen3, {
            "maxTokens": 300, "structured": {"jsonSchema": json.dumps(schema)},
            "sampling": {"temperature": 1.0, "seed": seed, "logitBias": {str(t): 100 for t in START + END}}})
        ids = ids_of(deltas)
        assert ids[:3] == START
        assert finish["usage"]["reasoningTokens"] == end_of(ids, END)
        assert out.usage.completion_tokens_details.reasoning_tokens == end_of(ids, END)


def test_forced_tool_call_comes_after_the_reasoning(qwen3):
    """Qwen3's template has both `<think>` and `<tool_call>`: a required tool
    call is enforced only after the reasoning section, which stays free, and
    the call is parsed out of the answer (no content left)."""
    schema = {"type": "object", "properties": {"n": {"enum": [1, 2, 3]}}, "required": ["n"],
              "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "pick", "parameters": schema}}]
    client = sdk(qwen3)
    for seed in range(3):
        out = client.chat.completions.create(
            model=MODEL, messages=MESSAGES, tools=tools, tool_choice="required", parallel_tool_calls=False,
            max_tokens=300, temperature=1.0, seed=seed,
            # The first start piece wins the first token (the rest of the
            # marker is forced); inside the section only end pieces win.
            logit_bias={str(START[0]): 50, **{str(t): 100 for t in END}})
        choice = out.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.content is None, choice.message
        [call] = choice.message.tool_calls
        assert call.function.name == "pick"
        jsonschema.validate(json.loads(call.function.arguments), schema)
        # The section (both markers at least) came first and was split off.
        assert out.usage.completion_tokens_details.reasoning_tokens >= len(START) + len(END)
        reasoning = (choice.message.model_extra or {}).get("reasoning_content") or ""
        assert "<tool_call>" not in reasoning and "</think>" not in reasoning


def test_structure_applies_from_the_start_without_a_section(qwen3):
    """If the output does not open `<think>`, the structure holds from its
    first token (the start marker is the only other way to begin)."""
    out = sdk(qwen3).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=20, temperature=1.0, seed=0,
        extra_body={"structured_outputs": {"regex": "[0-9]{3}"}})
    msg = out.choices[0].message
    assert re.fullmatch("[0-9]{3}", msg.content) and getattr(msg, "reasoning_content", None) is None
    assert out.usage.completion_tokens_details.reasoning_tokens == 0


def test_enable_thinking_false_leaves_markup_in_content(qwen3):
    regex = "<think>[a-z]{2}</think>[a-z]{2}"
    out = sdk(qwen3).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=40, temperature=1.0, seed=0,
        extra_body={"structured_outputs": {"regex": regex},
                    "chat_template_kwargs": {"enable_thinking": False}})
    msg = out.choices[0].message
    assert re.fullmatch(regex, msg.content)
    assert getattr(msg, "reasoning_content", None) is None and out.usage.completion_tokens_details is None


def test_thinking_on_splits_the_same_markup(qwen3):
    """The same forced markup with thinking on is split (the regex applies
    after the section, so the answer is forced by a second pattern)."""
    out = sdk(qwen3).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=300, temperature=1.0, seed=1,
        logit_bias={str(t): 100 for t in START + END},
        extra_body={"structured_outputs": {"regex": "[a-z]{2}"}})
    msg = out.choices[0].message
    assert re.fullmatch("[a-z]{2}", msg.content)
    assert msg.reasoning_content and not msg.reasoning_content.startswith("<think>")


def test_template_without_markers_has_no_parser(client):
    """tiny-qwen2's own (Qwen2.5) template mentions no reasoning: markup is content."""
    regex = "<think>[a-z]{2}</think>[a-z]{2}"
    out = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=40,
                                         extra_body={"structured_outputs": {"regex": regex}})
    msg = out.choices[0].message
    assert re.fullmatch(regex, msg.content)
    assert getattr(msg, "reasoning_content", None) is None and out.usage.completion_tokens_details is None


def test_reasoning_parser_none_flag(tmp_path_factory):
    server, d = start(tmp_path_factory, "qwen3-0.6b.jinja", "--reasoning-parser", "none")
    try:
        regex = "<think>[a-z]{2}</think>[a-z]{2}"
        out = sdk(server).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=40,
                                                  extra_body={"structured_outputs": {"regex": regex}})
        assert re.fullmatch(regex, out.choices[0].message.content)
        assert getattr(out.choices[0].message, "reasoning_content", None) is None
    finally:
        server.stop()
        shutil.rmtree(d.parent, ignore_errors=True)
