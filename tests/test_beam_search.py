"""Beam search end to end, on the real default model (SmolLM2-135M-Instruct).

`tests/fixtures/make_beam_refs.py` (run by `make models`) recorded
transformers' `generate(num_beams=…, num_return_sequences=…,
length_penalty=…, early_stopping=…, do_sample=False)` on the same GGUF for a
few chat prompts (as token ids). Here the official OpenAI SDK asks for
completions of those prompts with `best_of` (the beam width), `n`,
`length_penalty` and `early_stopping`: the choices must be transformers'
hypotheses, in order, with the same text and finish reasons. Over gRPC
(`Request.beam`), the token ids must be identical and `Finish.beam_score`
transformers' score. What beam search cannot be combined with is a 400
naming the param (INVALID_ARGUMENT over gRPC).
"""

from __future__ import annotations

import json

import openai
import pytest

import harness
from conftest import assert_no_panic

GGUF = harness.MODELS / "smollm2-135m-instruct.gguf"
REFS = harness.REPO / ".gyre" / "beam-ref" / "smollm2.json"
EARLY = {False: "EARLY_STOPPING_HEURISTIC", True: "EARLY_STOPPING_ALWAYS",
         "never": "EARLY_STOPPING_NEVER"}


@pytest.fixture(scope="module")
def refs():
    return json.loads(harness.require_file(REFS, "the beam-search references (make models)")
                      .read_text())["cases"]


@pytest.fixture(scope="module")
def server():
    harness.require_file(GGUF, "the default model (make models)")
    s = harness.Server.start([str(harness.GYRE_BIN), "serve", "--model", str(GGUF),
                              "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"])
    yield s
    s.stop()
    assert_no_panic(s)
    s.remove_log()


@pytest.fixture(scope="module")
def sdk(server):
    return openai.OpenAI(base_url=f"http://{server.http}/v1", api_key="unused", max_retries=0,
                         timeout=300)


def test_http_completions_are_transformers_beams(sdk, refs):
    finishes = set()
    for case in refs:
        r = sdk.completions.create(model="", prompt=case["prompt_ids"], n=case["n"],
                                   best_of=case["num_beams"], max_tokens=case["max_new_tokens"],
                                   extra_body={"length_penalty": case["length_penalty"],
                                               "early_stopping": case["early_stopping"]})
        hyps = case["hypotheses"]
        assert [c.index for c in r.choices] == list(range(len(hyps)))
        got = [(c.text, c.finish_reason) for c in r.choices]
        want = [(h["text"], h["finish"]) for h in hyps]
        assert got == want, case["messages"]
        assert r.usage.completion_tokens == sum(len(h["ids"]) for h in hyps)
        assert r.usage.prompt_tokens == len(case["prompt_ids"])
        finishes |= {c.finish_reason for c in r.choices}
    assert finishes == {"stop", "length"}


def test_grpc_beams_have_transformers_tokens_and_scores(server, refs):
    for case in refs:
        body = {"tokenIds": {"ids": case["prompt_ids"]}, "maxTokens": case["max_new_tokens"],
                "n": case["n"],
                "beam": {"width": case["num_beams"], "lengthPenalty": case["length_penalty"],
                         "earlyStopping": EARLY[case["early_stopping"]]}}
        r = harness.buf_curl(server.grpc, "gyre.v1.Generation/GenerateStream", body).ok()
        ids = {i: [] for i in range(case["n"])}
        scores = {}
        for m in r.messages:
            i = m.get("index", 0)
            ids[i] += m.get("delta", {}).get("tokenIds", [])
            if "finish" in m:
                scores[i] = m["finish"]["beamScore"]
                # The stop token is reported by the finish, not a delta.
                ids[i] += [m["finish"]["matchedStopTokenId"]] if "matchedStopTokenId" in m["finish"] else []
                assert m["finish"]["cumulativeLogprob"] <= 0
        for i, h in enumerate(case["hypotheses"]):
            assert ids[i] == h["ids"], (case["messages"], i)
            assert abs(scores[i] - h["score"]) <= 1e-2 + 1e-3 * abs(h["score"]), (scores[i], h)


@pytest.mark.parametrize("extra,param", [
    ({"n": 3, "best_of": 2}, "n"),
    ({"best_of": 17}, "best_of"),
    ({"best_of": 2, "stream": True}, "stream"),
    ({"best_of": 2, "temperature": 0.7}, "temperature"),
    ({"best_of": 2, "top_p": 0.5}, "top_p"),
    ({"best_of": 2, "seed": 1}, "seed"),
    ({"best_of": 2, "logit_bias": {"5": 1.0}}, "logit_bias"),
    ({"best_of": 2, "stop": ["x"]}, "stop"),
    ({"best_of": 2, "logprobs": 1}, "logprobs"),
    ({"best_of": 2, "min_tokens": 1}, "min_tokens"),
    ({"best_of": 2, "num_assistant_tokens": 4}, "num_assistant_tokens"),
    ({"best_of": 2, "structured_outputs": {"choice": ["a", "b"]}}, "structured_outputs"),
    ({"best_of": 2, "early_stopping": "soon"}, "early_stopping"),
    ({"length_penalty": 0.5}, "length_penalty"),
])
def test_what_beam_search_cannot_do_is_a_400_naming_the_param(server, extra, param):
    r = harness.http_json(server.http, "/v1/completions",
                          {"model": "", "prompt": "Hello", "max_tokens": 4, **extra})
    assert r.status == 400, (r.status, r.body)
    err = r.json()["error"]
    assert err["param"] == param, err
    assert err["type"] == "invalid_request_error" and err["message"], err


def test_grpc_refuses_n_above_the_width(server):
    body = {"text": "Hello", "maxTokens": 4, "n": 3, "beam": {"width": 2}}
    r = harness.buf_curl(server.grpc, "gyre.v1.Generation/GenerateStream", body)
    assert r.rc != 0 and r.error["code"] == "invalid_argument", r.error
    assert "n (3)" in r.error["message"], r.error


def test_greedy_sampling_is_unchanged_by_best_of_1(sdk, refs):
    case = refs[0]
    plain = sdk.completions.create(model="", prompt=case["prompt_ids"], temperature=0,
                                   max_tokens=8)
    one = sdk.completions.create(model="", prompt=case["prompt_ids"], temperature=0,
                                 max_tokens=8, best_of=1)
    assert one.choices[0].text == plain.choices[0].text



def test_unset_max_tokens_leaves_room_for_every_beam(refs):
    # Unset max_tokens: what the KV cache leaves for each beam unshared, in
    # whole blocks (the engine refuses more). With 750 blocks of 16 tokens
    # the cache, not the context, sets that room.
    s = harness.Server.start([str(harness.GYRE_BIN), "serve", "--model", str(GGUF),
                              "--num-kv-blocks", "750",
                              "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"])
    try:
        client = openai.OpenAI(base_url=f"http://{s.http}/v1", api_key="unused", max_retries=0,
                               timeout=300)
        r = client.completions.create(model="", prompt=refs[0]["prompt_ids"], n=2, best_of=2,
                                      extra_body={"early_stopping": True})
        assert [c.finish_reason for c in r.choices] == ["stop", "stop"], r
        assert "Paris" in r.choices[0].text
    finally:
        s.stop()
    assert_no_panic(s)
    s.remove_log()
