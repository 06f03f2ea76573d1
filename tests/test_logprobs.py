"""Log-probabilities through the OpenAI API: chat (`logprobs` + `top_logprobs`)
and legacy completions (`logprobs: k`), whole and streamed (same values),
valid against the official spec, and numerically equal to transformers'
log-softmax on the same weights along the same tokens."""

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

import harness
import openai_schema as spec

MODEL = "tiny-qwen2"
PROMPT = [9707, 11, 1879, 0, 576, 6722, 315, 9625]
STEPS = 8


def test_completion_logprobs_match_transformers(qwen):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": STEPS, "temperature": 0, "ignore_eos": True,
            "logprobs": 3}
    reply = harness.http_json(qwen.http, "/v1/completions", body)
    assert reply.status == 200, reply.body
    out = reply.json()
    spec.validate(spec.COMPLETION, out)
    lp = out["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == STEPS
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0
    # Our greedy ids (from gRPC) and transformers' log-softmax along them.
    req = {"tokenIds": {"ids": PROMPT}, "maxTokens": STEPS, "ignoreEos": True, "sampling": {"temperature": 0},
           "logprobs": 3}
    events = harness.buf_curl(qwen.grpc, "gyre.v1.Generation/GenerateStream", req).ok().messages
    entries = [e for ev in events if "delta" in ev for e in ev["delta"].get("logprobs", [])]
    ids = [int(e.get("tokenId", 0)) for e in entries]
    assert len(ids) == STEPS
    model = AutoModelForCausalLM.from_pretrained(harness.model_dir(MODEL), dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + ids])).logits[0]
    ref = torch.log_softmax(logits.double(), dim=-1)
    for step, (tid, entry) in enumerate(zip(ids, entries)):
        row = ref[len(PROMPT) - 1 + step]
        assert abs(float(row[tid]) - entry["logprob"]) < 1e-4, step
        top = torch.topk(row, 3)
        assert [int(t.get("tokenId", 0)) for t in entry["topLogprobs"]] == top.indices.tolist(), step
        assert int(row.argmax()) == tid, "greedy picks the most likely token"
    # The HTTP values are the same numbers.
    assert all(abs(a - e["logprob"]) < 1e-5 for a, e in zip(lp["token_logprobs"], entries))


def test_chat_logprobs_stream_equals_non_stream(qwen):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": STEPS,
            "temperature": 0, "ignore_eos": True, "logprobs": True, "top_logprobs": 2}
    whole = harness.http_json(qwen.http, "/v1/chat/completions", body)
    assert whole.status == 200, whole.body
    out = whole.json()
    spec.validate(spec.CHAT, out)
    content = out["choices"][0]["logprobs"]["content"]
    assert len(content) == STEPS
    for e in content:
        assert len(e["top_logprobs"]) == 2
        assert e["top_logprobs"][0]["logprob"] >= e["top_logprobs"][1]["logprob"]
        assert e["token"] == e["top_logprobs"][0]["token"] and e["bytes"] == list(e["token"].encode())
    sse = harness.http_sse(qwen.http, "/v1/chat/completions", {**body, "stream": True})
    assert sse.status == 200 and sse.done
    streamed = []
    for chunk in sse.chunks():
        spec.validate(spec.CHAT_CHUNK, chunk)
        for c in chunk["choices"]:
            if c.get("logprobs"):
                streamed.extend(c["logprobs"]["content"])
    assert streamed == content
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in sse.chunks() if c["choices"])
    assert text == out["choices"][0]["message"]["content"]


def test_completion_logprobs_stream_equals_non_stream(client):
    args = dict(model=MODEL, prompt="Once upon a time", max_tokens=STEPS, temperature=0, logprobs=2,
                extra_body={"ignore_eos": True})
    whole = client.completions.create(**args).choices[0].logprobs
    tokens, offsets = [], []
    for chunk in client.completions.create(**args, stream=True):
        for c in chunk.choices:
            if c.logprobs:
                tokens.extend(c.logprobs.tokens)
                offsets.extend(c.logprobs.text_offset)
    assert tokens == whole.tokens and offsets == whole.text_offset


@pytest.mark.parametrize("kwargs,param", [
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
])
def test_chat_logprobs_errors(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                       **kwargs)
    assert err.value.body["param"] == param


def test_completion_logprobs_limit(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=2, logprobs=21)
    assert err.value.body["param"] == "logprobs"
