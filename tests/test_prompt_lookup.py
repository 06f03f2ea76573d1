"""Prompt-lookup decoding end to end, on the real default model
(SmolLM2-135M-Instruct): an edit-style request (repeat a paragraph with a
small change) answered with `num_assistant_tokens` is token for token the
plain greedy answer, over HTTP through the official SDK and over gRPC, while
the engine's counters show proposals the model accepted (steps saved); a
server started with `--prompt-lookup-tokens` speculates by default and a
request's `num_assistant_tokens: 0` turns it off; out-of-range values are
400s naming the param (INVALID_ARGUMENT naming the field over gRPC).
"""

from __future__ import annotations

import openai
import pytest

import harness
from conftest import assert_no_panic

GGUF = harness.MODELS / "smollm2-135m-instruct.gguf"
PARAGRAPH = ("The old lighthouse stood at the edge of the cliff, its white paint peeling in the salt "
             "wind. Every evening the keeper climbed the spiral stairs, lit the great lamp, and "
             "watched the ships pass safely through the narrow channel below.")
MESSAGES = [{"role": "user", "content":
             "Rewrite this paragraph exactly, but change 'white' to 'red':\n\n" + PARAGRAPH}]


@pytest.fixture(scope="module")
def server():
    harness.require_file(GGUF, "the default model (make models)")
    s = harness.Server.start([str(harness.GYRE_BIN), "serve", "--model", str(GGUF),
                              "--prompt-lookup-tokens", "6",
                              "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"])
    yield s
    s.stop()
    assert_no_panic(s)
    s.remove_log()


@pytest.fixture(scope="module")
def sdk(server):
    return openai.OpenAI(base_url=f"http://{server.http}/v1", api_key="unused", max_retries=0,
                         timeout=300)


def stats(server) -> dict:
    r = harness.buf_curl(server.grpc, "gyre.v1.Generation/GetStats", {}).ok()
    m = r.messages[0]
    # buf prints proto3 JSON: lowerCamelCase names, 64-bit counts as strings,
    # zeros left out.
    camel = {"speculative_proposed_tokens_total": "speculativeProposedTokensTotal",
             "speculative_accepted_tokens_total": "speculativeAcceptedTokensTotal",
             "steps_total": "stepsTotal", "generated_tokens_total": "generatedTokensTotal"}
    return {k: int(m.get(c, 0)) for k, c in camel.items()}


def chat(sdk, **extra):
    r = sdk.chat.completions.create(model="", messages=MESSAGES, temperature=0, max_tokens=80,
                                    extra_body=extra)
    return r.choices[0].message.content, r.usage.completion_tokens


def test_lookup_is_greedy_and_saves_steps(server, sdk):
    before = stats(server)
    plain, n_plain = chat(sdk, num_assistant_tokens=0)
    mid = stats(server)
    assert mid["speculative_proposed_tokens_total"] == before["speculative_proposed_tokens_total"]
    fast, n_fast = chat(sdk, num_assistant_tokens=8, max_ngram_size=3)
    after = stats(server)
    assert (fast, n_fast) == (plain, n_plain)
    # The answer copies the paragraph: the model accepted proposals, so the
    # speculative run took fewer steps than it generated tokens.
    accepted = after["speculative_accepted_tokens_total"] - mid["speculative_accepted_tokens_total"]
    steps = after["steps_total"] - mid["steps_total"]
    assert accepted > 0, after
    assert steps < n_fast, (steps, n_fast)
    plain_steps = mid["steps_total"] - before["steps_total"]
    print(f"plain: {plain_steps} steps for {n_plain} tokens; lookup: {steps} steps, "
          f"{accepted} proposals accepted")


def test_server_default_applies_without_request_params(server, sdk):
    before = stats(server)
    default, _ = chat(sdk)
    after = stats(server)
    assert after["speculative_proposed_tokens_total"] > before["speculative_proposed_tokens_total"]
    plain, _ = chat(sdk, num_assistant_tokens=0)
    assert default == plain


def test_grpc_request_with_lookup_matches(server):
    # A raw-text prompt whose continuation copies its first paragraph.
    text = PARAGRAPH + "\n\n" + PARAGRAPH[:70]

    def generate(extra):
        body = {"text": text, "sampling": {"temperature": 0}, "max_tokens": 40, **extra}
        r = harness.buf_curl(server.grpc, "gyre.v1.Generation/GenerateStream", body).ok()
        return "".join(m.get("delta", {}).get("text", "") for m in r.messages)
    before = stats(server)
    fast = generate({"num_assistant_tokens": 5, "max_ngram_size": 2})
    after = stats(server)
    assert after["speculative_accepted_tokens_total"] > before["speculative_accepted_tokens_total"]
    assert fast and fast == generate({"num_assistant_tokens": 0})


@pytest.mark.parametrize("extra,param", [
    ({"num_assistant_tokens": 65}, "num_assistant_tokens"),
    ({"max_ngram_size": 0}, "max_ngram_size"),
    ({"max_ngram_size": 17}, "max_ngram_size"),
    ({"num_assistant_tokens": -1}, "num_assistant_tokens"),
])
def test_out_of_range_is_a_400_naming_the_param(sdk, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        sdk.chat.completions.create(model="", messages=MESSAGES, max_tokens=2, extra_body=extra)
    assert e.value.body["param"] == param, e.value.body


def test_out_of_range_over_grpc_names_the_field(server):
    body = {"text": "hi", "max_tokens": 2, "num_assistant_tokens": 100}
    r = harness.buf_curl(server.grpc, "gyre.v1.Generation/GenerateStream", body)
    assert r.rc != 0 and r.error["code"] == "invalid_argument", r.error
    assert "num_assistant_tokens" in r.error["message"], r.error
