"""Chat-template options against transformers' `apply_chat_template`, run in
this test: `continue_final_message` (the prompt ends inside the last
message) and `chat_template_kwargs` (the real Qwen3 template's
`enable_thinking`), through HTTP /tokenize, gRPC Tokenize and chat
completions."""

import json
import os
import shutil
from pathlib import Path

import openai
import pytest
from transformers import AutoTokenizer

import harness

MODEL = "tiny-qwen2"
QWEN3_TEMPLATE = harness.REPO / "tests" / "data" / "chat-templates" / "qwen3-0.6b.jinja"
PARTIAL = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "The answer is"}]


def hf_ids(tok, messages, **kwargs) -> list[int]:
    text = tok.apply_chat_template(messages, tokenize=False, **kwargs)
    return tok(text, add_special_tokens=False).input_ids


def test_continue_final_message_matches_transformers(qwen):
    tok = AutoTokenizer.from_pretrained(harness.model_dir(MODEL))
    want = hf_ids(tok, PARTIAL, continue_final_message=True)
    body = {"model": MODEL, "messages": PARTIAL, "continue_final_message": True, "add_generation_prompt": False}
    reply = harness.http_json(qwen.http, "/tokenize", body)
    assert reply.status == 200, reply.body
    assert reply.json()["tokens"] == want
    assert tok.decode(want).endswith("The answer is")


def test_continue_final_message_in_chat_completions(client):
    out = client.chat.completions.create(
        model=MODEL, messages=PARTIAL, max_tokens=3, temperature=0,
        extra_body={"continue_final_message": True, "add_generation_prompt": False})
    assert out.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=MODEL, messages=PARTIAL, max_tokens=3,
            extra_body={"continue_final_message": True, "add_generation_prompt": True})


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory) -> Path:
    """tiny-qwen2's weights and tokenizer with the real Qwen3 chat template."""
    src = harness.model_dir(MODEL)
    dst = tmp_path_factory.mktemp("qwen3-template") / MODEL
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "tokenizer_config.json":
            os.symlink(f, dst / f.name)
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["chat_template"] = harness.require_file(QWEN3_TEMPLATE, "the Qwen3 chat template").read_text()
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    yield dst
    shutil.rmtree(dst.parent, ignore_errors=True)


def test_chat_template_kwargs_match_transformers(qwen3_dir):
    tok = AutoTokenizer.from_pretrained(qwen3_dir)
    messages = [{"role": "user", "content": "Hi!"}]
    server = harness.Server.start([str(harness.GYRE_BIN), "grpc", "--model", str(qwen3_dir),
                                   "--grpc-addr", "127.0.0.1:0"], want=("gRPC",))
    try:
        seen = set()
        for kwargs in ({}, {"enable_thinking": False}, {"enable_thinking": True}):
            want = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
            req = {"chat": {"messages": messages, "chatTemplateKwargs": kwargs}}
            [got] = harness.buf_curl(server.grpc, "gyre.v1.Generation/Tokenize", req).ok().messages
            assert got["prompt"] == want, kwargs
            seen.add(want)
        assert len(seen) == 2, "enable_thinking=False must change the Qwen3 render"
    finally:
        server.stop()
        server.remove_log()
