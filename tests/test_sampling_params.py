"""Sampling parameters through the whole stack: logit_bias bans and forces
tokens, min_tokens holds back stop tokens, penalties keep seeded runs
reproducible, and every out-of-range value is a 400 naming its param (OpenAI
SDK) or INVALID_ARGUMENT (gRPC)."""

import openai
import pytest

import harness

MODEL = "tiny-qwen2"
PROMPT = [9707, 11, 1879, 0, 576, 6722, 315, 9625]


def grpc_tokens(server, **extra) -> tuple[list[int], dict]:
    req = {"tokenIds": {"ids": PROMPT}, "maxTokens": 12, "ignoreEos": True,
           "sampling": {"temperature": 0}, **extra}
    events = harness.buf_curl(server.grpc, "gyre.v1.Generation/GenerateStream", req).ok().messages
    ids = [int(t) for e in events if "delta" in e for t in e["delta"].get("tokenIds", [])]
    return ids, events[-1]["finish"]


def test_logit_bias_bans_and_forces_tokens(qwen):
    greedy, _ = grpc_tokens(qwen)
    first = greedy[0]
    banned, _ = grpc_tokens(qwen, sampling={"temperature": 0, "logitBias": {str(first): -100}})
    assert first not in banned
    assert banned != greedy
    forced, _ = grpc_tokens(qwen, sampling={"temperature": 0, "logitBias": {"42": 100}})
    assert forced == [42] * 12


def test_logit_bias_through_the_sdk(client):
    base = dict(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0)
    plain = client.completions.create(**base).choices[0].text
    forced = client.completions.create(**base, logit_bias={"42": 100}).choices[0].text
    # Token 42 is "K" in the Qwen vocabulary (and not the greedy choice).
    assert plain != "K"
    assert forced == "K"


def test_min_tokens_holds_back_stop_tokens(qwen):
    greedy, _ = grpc_tokens(qwen)
    stop_id = greedy[0]
    stopped, finish = grpc_tokens(qwen, stopTokenIds=[stop_id])
    assert stopped == [] and finish["reason"] == "FINISH_REASON_STOP"
    assert int(finish["matchedStopTokenId"]) == stop_id
    held, finish = grpc_tokens(qwen, stopTokenIds=[stop_id], minTokens=4)
    assert len(held) >= 4 and stop_id not in held[:4]


def test_seeded_runs_with_penalties_are_reproducible(client):
    args = dict(model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=1.0, seed=7,
                presence_penalty=0.5, frequency_penalty=0.7,
                extra_body={"repetition_penalty": 1.3, "min_p": 0.05, "top_k": 50})
    a = client.completions.create(**args).choices[0].text
    b = client.completions.create(**args).choices[0].text
    assert a == b
    assert client.completions.create(**{**args, "seed": 8}).choices[0].text != a or \
        client.completions.create(**{**args, "seed": 9}).choices[0].text != a


@pytest.mark.parametrize("kwargs,param", [
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"frequency_penalty": -2.5}, "frequency_penalty"),
    ({"extra_body": {"min_p": 1.5}}, "min_p"),
    ({"extra_body": {"repetition_penalty": 0}}, "repetition_penalty"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {"999999999": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"extra_body": {"min_tokens": 10}, "max_tokens": 5}, "min_tokens"),
])
def test_out_of_range_values_are_400_with_param(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="hi", **{"max_tokens": 4, **kwargs})
    assert err.value.status_code == 400
    assert err.value.body["param"] == param, err.value.body


def test_out_of_range_over_grpc_is_invalid_argument(qwen):
    req = {"text": "hi", "maxTokens": 2, "sampling": {"presencePenalty": 9}}
    res = harness.buf_curl(qwen.grpc, "gyre.v1.Generation/GenerateStream", req)
    assert res.rc != 0 and res.error["code"] == "invalid_argument", res.stderr


def test_include_stop_str_in_output(client):
    base = dict(model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=0)
    text = client.completions.create(**base).choices[0].text
    stop = text[5:8]
    assert stop and stop in text
    cut = client.completions.create(**base, stop=[stop]).choices[0]
    kept = client.completions.create(**base, stop=[stop], extra_body={"include_stop_str_in_output": True}).choices[0]
    assert cut.finish_reason == kept.finish_reason == "stop"
    assert kept.text == cut.text + stop
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        **base, stop=[stop], stream=True, extra_body={"include_stop_str_in_output": True}) if c.choices)
    assert streamed == kept.text


@pytest.mark.parametrize("stream", [False, True])
def test_skip_special_tokens(client, stream):
    # <|im_end|> (a special token, and EOS) forced by logit_bias; ignore_eos
    # keeps generating it. Skipped by default, shown when asked.
    args = dict(model=MODEL, prompt="Once upon a time", max_tokens=3, temperature=0, logit_bias={"151645": 100})

    def text(**extra_body):
        body = {"ignore_eos": True, **extra_body}
        if not stream:
            return client.completions.create(**args, extra_body=body).choices[0].text
        return "".join(c.choices[0].text for c in client.completions.create(**args, stream=True, extra_body=body)
                       if c.choices)

    assert text() == ""
    assert text(skip_special_tokens=True) == ""
    assert text(skip_special_tokens=False) == "<|im_end|>" * 3
    # Chat too.
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                          temperature=0, logit_bias={"151645": 100},
                                          extra_body={"ignore_eos": True, "skip_special_tokens": False})
    assert chat.choices[0].message.content == "<|im_end|>" * 2
