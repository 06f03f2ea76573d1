"""Output fidelity through the whole stack, for every tiny model.

Each model's golden.json holds the greedy continuation transformers produced
for `prompt_ids` with EOS disabled (`greedy_ids`; `greedy_text` is the text
they add after the prompt, as transformers' text-generation pipeline returns
it, and `greedy_decoded` the ids decoded alone).
gyre must reproduce it exactly: the token ids over gRPC (`GenerateStream`
deltas carry them), the text over the OpenAI shim (`/v1/completions` with a
token-id prompt and the vLLM-style `ignore_eos` extension), and both in the
same process started with `gyre serve --model <dir>`.
"""

from __future__ import annotations

import pytest

import harness
from conftest import MODELS

GREEDY_TOKENS = 32
# Every family the fixtures have: the shared models plus Qwen3, a Mistral
# whose sliding window (24) is shorter than its prompt, Gemma 3 and Gemma 2,
# Phi-3 (window), Phi-4-mini style (longrope, partial rotary) and the MoE
# families.
FAMILIES = (*MODELS, "tiny-qwen3", "tiny-mistral-sw", "tiny-gemma3", "tiny-gemma2",
            "tiny-phi3", "tiny-phi4", "tiny-mixtral", "tiny-qwen3-moe")


@pytest.fixture(scope="module", params=FAMILIES)
def case(request, model_server):
    name = request.param
    return name, model_server(name), harness.golden(name)


def test_grpc_greedy_token_ids_match_transformers(case):
    name, server, gold = case
    assert len(gold["greedy_ids"]) == GREEDY_TOKENS
    req = {"model": name, "tokenIds": {"ids": gold["prompt_ids"]}, "maxTokens": GREEDY_TOKENS,
           "ignoreEos": True, "sampling": {"temperature": 0}}
    res = harness.buf_curl(server.grpc, "gyre.v1.Generation/GenerateStream", req).ok()
    ids = [int(t) for m in res.messages if "delta" in m for t in m["delta"].get("tokenIds", [])]
    assert ids == gold["greedy_ids"], f"{name}: greedy ids differ from transformers"
    finish = res.messages[-1]["finish"]
    assert finish["reason"] == "FINISH_REASON_LENGTH"
    assert finish["usage"]["promptTokens"] == len(gold["prompt_ids"])
    assert finish["usage"]["completionTokens"] == GREEDY_TOKENS


def test_openai_completion_matches_transformers(case):
    import openai

    name, server, gold = case
    client = openai.OpenAI(base_url=f"http://{server.http}/v1", api_key="unused", max_retries=0, timeout=120)
    params = dict(model=name, prompt=gold["prompt_ids"], max_tokens=GREEDY_TOKENS, temperature=0,
                  extra_body={"ignore_eos": True})
    r = client.completions.create(**params)
    assert r.choices[0].text == gold["greedy_text"], f"{name}: greedy text differs from transformers"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(gold["prompt_ids"])
    assert r.usage.completion_tokens == GREEDY_TOKENS

    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **params) if c.choices)
    assert streamed == gold["greedy_text"]


def test_detokenize_greedy_ids_matches_transformers(case):
    name, server, gold = case
    body = {"model": name, "tokenIds": gold["greedy_ids"]}
    res = harness.buf_curl(server.grpc, "gyre.v1.Generation/Detokenize", body).ok()
    assert res.messages[0]["text"] == gold["greedy_decoded"]


def test_tokenize_prompt_matches_transformers(case):
    name, server, gold = case
    body = {"model": name, "text": gold["prompt"], "addSpecialTokens": False}
    res = harness.buf_curl(server.grpc, "gyre.v1.Generation/Tokenize", body).ok()
    assert [int(t) for t in res.messages[0].get("tokenIds", [])] == gold["prompt_ids"]
