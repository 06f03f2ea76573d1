"""Prompt-lookup decoding end to end, on the real default model
(SmolLM2-135M-Instruct): an edit-style request (repeat a paragraph with a
small change) answered with `num_assistant_tokens` is token for token the
plain greedy answer, over HTTP through the official SDK and over gRPC, while
the engine's counters show proposals the model accepted (steps saved); a
server started with `--prompt-lookup-tokens` speculates by default and a
request's `num_assistant_tokens: 0` turns it off, and a model's
`prompt_lookup` key sets its own default; each response's usage reports its
own proposals (OpenAI's `accepted_prediction_tokens` /
`rejected_prediction_tokens`, the proto's `speculative_*_tokens`), equal to
what the engine's counters moved by; out-of-range values are 400s naming the
param (INVALID_ARGUMENT naming the field over gRPC) and a bad model key
fails the start. vLLM's `--speculative-config '{"method": "ngram", ...}'`
turns prompt lookup on by default with its tokens per step and n-gram
bounds (its shortest n-gram holds back the shorter matches), and a config
gyre cannot run fails the start naming what is wrong.
"""

from __future__ import annotations

import json
import os
import subprocess

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


def chat(sdk, model="", **extra):
    r = sdk.chat.completions.create(model=model, messages=MESSAGES, temperature=0, max_tokens=80,
                                    extra_body=extra)
    return r.choices[0].message.content, r.usage.completion_tokens


def chat_usage(sdk, model="", **extra):
    r = sdk.chat.completions.create(model=model, messages=MESSAGES, temperature=0, max_tokens=80,
                                    extra_body=extra)
    return r.choices[0].message.content, r.usage


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
    # The response's own usage has the same counts as the engine's counters.
    _, usage = chat_usage(sdk, num_assistant_tokens=8, max_ngram_size=3)
    again = stats(server)
    d = usage.completion_tokens_details
    proposed = again["speculative_proposed_tokens_total"] - after["speculative_proposed_tokens_total"]
    assert d.accepted_prediction_tokens == again["speculative_accepted_tokens_total"] - after[
        "speculative_accepted_tokens_total"] > 0, (d, again, after)
    assert d.rejected_prediction_tokens == proposed - d.accepted_prediction_tokens, (d, proposed)
    _, plain_usage = chat_usage(sdk, num_assistant_tokens=0)
    assert plain_usage.completion_tokens_details is None, plain_usage
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


def test_streamed_usage_has_the_counts(server, sdk):
    before = stats(server)
    stream = sdk.chat.completions.create(model="", messages=MESSAGES, temperature=0, max_tokens=60,
                                         stream=True, stream_options={"include_usage": True},
                                         extra_body={"num_assistant_tokens": 8})
    usage = [c.usage for c in stream if c.usage is not None]
    after = stats(server)
    assert len(usage) == 1, usage
    d = usage[0].completion_tokens_details
    proposed = after["speculative_proposed_tokens_total"] - before["speculative_proposed_tokens_total"]
    accepted = after["speculative_accepted_tokens_total"] - before["speculative_accepted_tokens_total"]
    assert (d.accepted_prediction_tokens, d.rejected_prediction_tokens) == (
        accepted, proposed - accepted), (d, proposed, accepted)
    assert accepted > 0


def test_grpc_request_with_lookup_matches(server):
    # A raw-text prompt whose continuation copies its first paragraph.
    text = PARAGRAPH + "\n\n" + PARAGRAPH[:70]

    def generate(extra):
        body = {"text": text, "sampling": {"temperature": 0}, "max_tokens": 40, **extra}
        r = harness.buf_curl(server.grpc, "gyre.v1.Generation/GenerateStream", body).ok()
        usage = [m["finish"]["usage"] for m in r.messages if "finish" in m]
        assert len(usage) == 1, r.messages
        return "".join(m.get("delta", {}).get("text", "") for m in r.messages), usage[0]
    before = stats(server)
    fast, usage = generate({"num_assistant_tokens": 5, "max_ngram_size": 2})
    after = stats(server)
    accepted = after["speculative_accepted_tokens_total"] - before["speculative_accepted_tokens_total"]
    proposed = after["speculative_proposed_tokens_total"] - before["speculative_proposed_tokens_total"]
    assert accepted > 0
    # The Finish message's usage (proto3 JSON names).
    assert int(usage["speculativeAcceptedTokens"]) == accepted, usage
    assert int(usage["speculativeProposedTokens"]) == proposed, usage
    plain, plain_usage = generate({"num_assistant_tokens": 0})
    assert fast and fast == plain
    assert "speculativeProposedTokens" not in plain_usage, plain_usage


def test_a_predicted_output_is_proposed_and_changes_nothing(server, sdk):
    # A question whose answer is not in the prompt: prompt lookup alone
    # finds little to propose, a prediction of the answer finds most of it.
    messages = [{"role": "user", "content": "Tell me a short story about a lighthouse keeper."}]

    def ask(**extra):
        r = sdk.chat.completions.create(model="", messages=messages, temperature=0, max_tokens=80,
                                        extra_body=extra)
        return r.choices[0].message.content, r.usage

    plain, _ = ask(num_assistant_tokens=0)
    looked, lookup_usage = ask()
    # The SDK's own `prediction` parameter (OpenAI's Predicted Outputs).
    r = sdk.chat.completions.create(model="", messages=messages, temperature=0, max_tokens=80,
                                    prediction={"type": "content", "content": plain})
    predicted, usage = r.choices[0].message.content, r.usage
    assert predicted == plain == looked
    with_prediction = usage.completion_tokens_details.accepted_prediction_tokens
    alone = lookup_usage.completion_tokens_details.accepted_prediction_tokens
    assert with_prediction > alone, (usage, lookup_usage)
    assert with_prediction >= usage.completion_tokens // 2, usage
    # `num_assistant_tokens: 0` still turns speculation off.
    _, off = ask(num_assistant_tokens=0, prediction={"type": "content", "content": plain})
    assert off.completion_tokens_details is None, off


def test_bad_predictions_are_400s(sdk):
    for prediction, param in [({"type": "guess", "content": "x"}, "prediction.type"),
                              ({"type": "content", "content": 7}, "prediction.content"),
                              ({"type": "content", "content": "word " * 40000}, "prediction")]:
        with pytest.raises(openai.BadRequestError) as e:
            sdk.chat.completions.create(model="", messages=MESSAGES, max_tokens=2,
                                        extra_body={"prediction": prediction})
        assert e.value.body["param"] == param, e.value.body


def test_a_prediction_over_grpc(server):
    text = "The keeper of the lighthouse said:"
    def generate(extra):
        body = {"text": text, "sampling": {"temperature": 0}, "max_tokens": 40, **extra}
        r = harness.buf_curl(server.grpc, "gyre.v1.Generation/GenerateStream", body).ok()
        usage = [m["finish"]["usage"] for m in r.messages if "finish" in m][0]
        return "".join(m.get("delta", {}).get("text", "") for m in r.messages), usage
    plain, _ = generate({"num_assistant_tokens": 0})
    fast, usage = generate({"prediction": plain})
    assert fast == plain
    assert int(usage.get("speculativeAcceptedTokens", 0)) >= 20, usage
    # On stdin: too long for an argument.
    long = harness.buf_curl(server.grpc, "gyre.v1.Generation/GenerateStream",
                            [{"text": "hi", "max_tokens": 2, "prediction": "word " * 40000}])
    assert long.rc != 0 and long.error["code"] == "invalid_argument", long.error
    assert "prediction" in long.error["message"], long.error


@pytest.mark.parametrize("extra,param", [
    ({"num_assistant_tokens": 65}, "num_assistant_tokens"),
    ({"max_ngram_size": 0}, "max_ngram_size"),
    ({"max_ngram_size": 17}, "max_ngram_size"),
    ({"num_assistant_tokens": -1}, "num_assistant_tokens"),
    # Only for a model with a draft model.
    ({"assistant_confidence_threshold": 0.5}, "assistant_confidence_threshold"),
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


@pytest.fixture(scope="module")
def two_names():
    harness.require_file(GGUF, "the default model (make models)")
    # One server, the same weights under two names: `fast` speculates by
    # default through its key, `plain` follows the server (off).
    s = harness.Server.start([str(harness.GYRE_BIN), "serve",
                              "--model", f"{GGUF},name=fast,prompt_lookup=8",
                              "--model", f"{GGUF},name=plain",
                              "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"])
    yield s
    s.stop()
    assert_no_panic(s)
    s.remove_log()


def test_a_models_prompt_lookup_key_sets_its_default(two_names):
    s = two_names
    sdk = openai.OpenAI(base_url=f"http://{s.http}/v1", api_key="unused", max_retries=0,
                        timeout=300)
    fast, fast_usage = chat_usage(sdk, model="fast")
    plain, plain_usage = chat_usage(sdk, model="plain")
    assert fast == plain
    assert fast_usage.completion_tokens_details.accepted_prediction_tokens > 0, fast_usage
    assert plain_usage.completion_tokens_details is None, plain_usage
    # A request still overrides the model's default.
    _, off = chat_usage(sdk, model="fast", num_assistant_tokens=0)
    assert off.completion_tokens_details is None, off


@pytest.mark.parametrize("value", ["65", "lots"])
def test_a_bad_prompt_lookup_key_fails_the_start(value):
    harness.require_file(GGUF, "the default model (make models)")
    p = subprocess.run([str(harness.GYRE_BIN), "serve", "--model", f"{GGUF},prompt_lookup={value}",
                        "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert p.returncode != 0 and "listening" not in p.stdout, (p.returncode, p.stderr[-2000:])
    assert "prompt_lookup" in p.stderr and "0 to 64" in p.stderr, p.stderr[-2000:]
    assert "panicked" not in p.stderr


def serve_with_config(config: dict) -> harness.Server:
    harness.require_file(GGUF, "the default model (make models)")
    return harness.Server.start([str(harness.GYRE_BIN), "serve", "--model", str(GGUF),
                                 "--speculative-config", json.dumps(config),
                                 "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"])


def test_vllms_ngram_config_turns_prompt_lookup_on_by_default():
    s = serve_with_config({"method": "ngram", "num_speculative_tokens": 6,
                           "prompt_lookup_max": 3, "prompt_lookup_min": 1})
    try:
        sdk = openai.OpenAI(base_url=f"http://{s.http}/v1", api_key="unused", max_retries=0,
                            timeout=300)
        before = stats(s)
        text, usage = chat_usage(sdk)
        after = stats(s)
        proposed = after["speculative_proposed_tokens_total"] - before["speculative_proposed_tokens_total"]
        accepted = after["speculative_accepted_tokens_total"] - before["speculative_accepted_tokens_total"]
        steps = after["steps_total"] - before["steps_total"]
        d = usage.completion_tokens_details
        assert proposed > 0 and accepted > 0, after
        assert (d.accepted_prediction_tokens, d.rejected_prediction_tokens) == (
            accepted, proposed - accepted), (d, proposed, accepted)
        # At most 6 proposals a step.
        assert proposed <= 6 * steps, (proposed, steps)
        # The defaults are those the request could have sent itself: the
        # same proposals, step for step (greedy is deterministic).
        same, explicit = chat_usage(sdk, num_assistant_tokens=6, max_ngram_size=3)
        assert same == text
        assert explicit.completion_tokens_details == d, (explicit, usage)
        plain, plain_usage = chat_usage(sdk, num_assistant_tokens=0)
        assert plain == text and plain_usage.completion_tokens_details is None, plain_usage
        print(f"--speculative-config ngram: {accepted} of {proposed} proposals accepted in "
              f"{steps} steps for {usage.completion_tokens} tokens")
    finally:
        s.stop()
    assert_no_panic(s)
    s.remove_log()


def test_prompt_lookup_min_holds_back_shorter_ngrams():
    """`prompt_lookup_min` 16 (and so, as vLLM says, `prompt_lookup_max` 16):
    in the answer's first 12 tokens the latest 16 tokens still hold the
    chat template's assistant header, which occurs nowhere earlier, so
    nothing is proposed; a request's `max_ngram_size: 1` lowers the
    shortest n-gram to 1 and single tokens of the prompt match."""
    s = serve_with_config({"method": "ngram", "num_speculative_tokens": 6,
                           "prompt_lookup_min": 16})
    try:
        sdk = openai.OpenAI(base_url=f"http://{s.http}/v1", api_key="unused", max_retries=0,
                            timeout=300)

        def ask(**extra):
            r = sdk.chat.completions.create(model="", messages=MESSAGES, temperature=0,
                                            max_tokens=12, extra_body=extra)
            return r.choices[0].message.content, r.usage

        before = stats(s)
        held, usage = ask()
        after = stats(s)
        assert usage.completion_tokens == 12, usage
        assert usage.completion_tokens_details is None, usage
        assert after["speculative_proposed_tokens_total"] == before["speculative_proposed_tokens_total"]
        short, short_usage = ask(max_ngram_size=1)
        assert short == held
        assert short_usage.completion_tokens_details is not None, short_usage
        d = short_usage.completion_tokens_details
        assert d.accepted_prediction_tokens + d.rejected_prediction_tokens > 0, d
    finally:
        s.stop()
    assert_no_panic(s)
    s.remove_log()


@pytest.mark.parametrize("config,extra,message", [
    ('{"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 3}',
     [], "method `eagle` is not supported"),
    ('{"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": 4}',
     [], "unknown key `disable_by_batch_size`"),
    ('{"method": "ngram", "num_speculative_tokens": 65}',
     [], "`num_speculative_tokens` must be a whole number from 1 to 64, got 65"),
    ('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2, "prompt_lookup_min": 3}',
     [], "prompt_lookup_min (3) must be at most prompt_lookup_max (2)"),
    ('{"method": "ngram", "num_speculative_tokens": 3}',
     ["--prompt-lookup-tokens", "4"], "--speculative-config and --prompt-lookup-tokens both set speculation"),
])
def test_a_speculative_config_gyre_cannot_run_fails_the_start(config, extra, message):
    harness.require_file(GGUF, "the default model (make models)")
    p = subprocess.run([str(harness.GYRE_BIN), "serve", "--model", str(GGUF),
                        "--speculative-config", config, *extra,
                        "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert p.returncode != 0 and "listening" not in p.stdout, (p.returncode, p.stderr[-2000:])
    assert "--speculative-config" in p.stderr and message in p.stderr, p.stderr[-2000:]
    assert "panicked" not in p.stderr


def test_the_speculative_config_is_also_read_from_the_environment():
    harness.require_file(GGUF, "the default model (make models)")
    env = {**os.environ, "GYRE_SPECULATIVE_CONFIG": '{"method": "medusa"}'}
    p = subprocess.run([str(harness.GYRE_BIN), "serve", "--model", str(GGUF),
                        "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                       env=env)
    assert p.returncode != 0 and "method `medusa` is not supported" in p.stderr, p.stderr[-2000:]
