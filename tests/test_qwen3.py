"""Qwen3 end to end: the tiny random-weight Qwen3 (`Qwen3ForCausalLM`, q/k
norms, tied embeddings) served with the real Qwen3 chat template, through
the official OpenAI SDK and gRPC.

Its greedy continuation matches transformers in test_fidelity.py; here the
chat features Qwen3 is used for work on it: the reasoning section
(`<think>...</think>`, which Qwen3 opens itself) is split from the answer,
`enable_thinking: false` turns that off, and Hermes-style tool calls are
parsed into `tool_calls`. The weights are random, so the output is steered
with `logit_bias` (only the marker pieces can win) and constrained decoding;
every expectation is derived from the same request's raw token ids.
"""

import json
import re

import jsonschema
import openai
import pytest

import harness

MODEL = "tiny-qwen3"
MESSAGES = [{"role": "user", "content": "Think, then answer."}]
# The Qwen2.5 tokenizer's pieces of "<think>" and "</think>".
START = [13708, 766, 29]
END = [522, 26865, 29]
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
          "additionalProperties": False}
WEATHER = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"],
           "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]


@pytest.fixture(scope="module")
def server(model_server):
    return model_server(MODEL)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://{server.http}/v1", api_key="unused", max_retries=0, timeout=120)


def test_the_fixture_is_qwen3_with_its_template(server):
    cfg = json.loads((harness.model_dir(MODEL) / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"]
    template = json.loads((harness.model_dir(MODEL) / "tokenizer_config.json").read_text())["chat_template"]
    assert template == (harness.REPO / "tests/data/chat-templates/qwen3-0.6b.jinja").read_text()


def raw_ids(server, body: dict) -> tuple[list[int], str]:
    """A chat request over gRPC: its token ids and their detokenized text."""
    req = {"model": MODEL, "chat": {"messages": MESSAGES}, **body}
    msgs = harness.buf_curl(server.grpc, "gyre.v1.Generation/GenerateStream", req).ok().messages
    ids = [int(t) for m in msgs if "delta" in m for t in m["delta"].get("tokenIds", [])]
    [res] = harness.buf_curl(server.grpc, "gyre.v1.Generation/Detokenize",
                             {"model": MODEL, "tokenIds": ids}).ok().messages
    return ids, res.get("text", "")


def test_reasoning_is_split_from_a_structured_answer(client, server):
    bias = {str(t): 100 for t in START + END}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}}
    checked = 0
    for seed in range(12):
        out = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=400, temperature=1.0,
                                             seed=seed, logit_bias=bias, response_format=fmt)
        if out.choices[0].finish_reason == "length":
            continue  # this sample never closed its reasoning section
        assert out.choices[0].finish_reason == "stop"
        msg = out.choices[0].message
        jsonschema.validate(json.loads(msg.content), SCHEMA)
        # The same sample's raw text: reasoning, the end marker, the answer.
        ids, text = raw_ids(server, {"maxTokens": 400, "structured": {"jsonSchema": json.dumps(SCHEMA)},
                                     "sampling": {"temperature": 1.0, "seed": seed,
                                                  "logitBias": {str(t): 100 for t in START + END}}})
        assert ids[:len(START)] == START, "the model opened the section itself"
        before, after = text.split("</think>", 1)
        assert msg.content == after
        assert msg.reasoning_content == before.removeprefix("<think>")
        assert msg.reasoning_content and "</think>" not in msg.reasoning_content
        checked += 1
    assert checked >= 3, f"only {checked} of 12 samples closed their reasoning section"


def test_enable_thinking_false_leaves_the_output_unparsed(client, server):
    bias = {str(t): 100 for t in START + END}
    out = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=1.0, seed=5,
                                         logit_bias=bias,
                                         extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    msg = out.choices[0].message
    assert msg.model_extra.get("reasoning_content") is None
    assert "think>" in msg.content
    # The template closed an empty thinking section in the prompt itself.
    thinking = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1, temperature=0)
    assert out.usage.prompt_tokens > thinking.usage.prompt_tokens


def test_tool_calls_are_parsed(client):
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS,
            tool_choice=choice, parallel_tool_calls=False, n=4, temperature=1.0, seed=11, max_tokens=200,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        for c in reply.choices:
            assert c.finish_reason == "tool_calls", c
            assert c.message.content is None, c.message
            [call] = c.message.tool_calls
            assert call.type == "function" and call.function.name == "get_weather"
            assert re.fullmatch(r"[A-Za-z0-9]{9,}", call.id), call.id
            jsonschema.validate(json.loads(call.function.arguments), WEATHER)
