"""Phi-3 / Phi-4-mini, the mixture-of-experts families (Mixtral,
Qwen3-MoE) and Gemma 3 / Gemma 2 chat end to end through the official
OpenAI SDK.

Each tiny fixture's golden.json holds transformers' greedy answer
(`generate`, EOS disabled) to a system + user chat rendered with the
model's own chat template (`chat_prompt_ids`, `chat_greedy_text`). gyre,
started with `gyre serve --model <dir>`, must render the same prompt and
answer the same text, streamed and not. The Phi fixtures carry the real
Phi-3 chat template and tokenizer from tests/data, tiny-gemma3 the real
Gemma 3 chat template.
"""

from __future__ import annotations

import json

import openai
import pytest

import harness

CHAT_MODELS = ("tiny-phi3", "tiny-phi4", "tiny-mixtral", "tiny-qwen3-moe", "tiny-gemma3", "tiny-gemma2")


@pytest.fixture(scope="module", params=CHAT_MODELS)
def case(request, model_server):
    name = request.param
    return name, model_server(name), harness.golden(name)


def test_phi_fixtures_carry_the_real_phi3_template_and_tokenizer():
    src = harness.REPO / "tests/data/tokenizers/phi-3-mini-instruct"
    template = json.loads((src / "tokenizer_config.json").read_text())["chat_template"]
    for name in ("tiny-phi3", "tiny-phi4"):
        d = harness.model_dir(name)
        assert json.loads((d / "config.json").read_text())["architectures"] == ["Phi3ForCausalLM"]
        assert json.loads((d / "tokenizer_config.json").read_text())["chat_template"] == template
        assert (d / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()


def test_chat_answer_matches_transformers(case):
    name, server, gold = case
    client = openai.OpenAI(base_url=f"http://{server.http}/v1", api_key="unused", max_retries=0,
                           timeout=120)
    n = len(gold["chat_greedy_ids"])
    params = dict(model=name, messages=gold["chat_messages"], max_tokens=n, temperature=0,
                  extra_body={"ignore_eos": True})
    r = client.chat.completions.create(**params)
    assert r.usage.prompt_tokens == len(gold["chat_prompt_ids"]), f"{name}: rendered prompt differs"
    assert r.usage.completion_tokens == n
    assert r.choices[0].message.content == gold["chat_greedy_text"], f"{name}: answer differs"
    assert r.choices[0].finish_reason == "length"

    streamed = "".join(c.choices[0].delta.content or ""
                       for c in client.chat.completions.create(stream=True, **params) if c.choices)
    assert streamed == gold["chat_greedy_text"]
