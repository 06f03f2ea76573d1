"""Speculative decoding with a draft model end to end, on SmolLM2-135M-Instruct
with a draft made of its first 6 layers (tests/fixtures/make_draft.py): the
server loads it with `--draft-model`, requests speculate with it by
default, and every answer is token for token the plain greedy answer, over
HTTP through the official SDK and over gRPC, whatever
`num_assistant_tokens` or `assistant_confidence_threshold` says; the
engine's draft counters move and each response's usage reports its own
proposals; `max_ngram_size` picks prompt lookup instead; both parameters
at once, or out of range, are 400s naming the param (INVALID_ARGUMENT over
gRPC); a model's generation_config.json sets the default (on a fixture
model drafted by another fixture family); and a draft with another
vocabulary fails the start.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import openai
import pytest

import harness
from conftest import assert_no_panic

GGUF = harness.MODELS / "smollm2-135m-instruct.gguf"
MAKE_DRAFT = Path(__file__).parent / "fixtures" / "make_draft.py"
MESSAGES = [{"role": "user", "content": "Write three sentences about a lighthouse keeper."}]


@pytest.fixture(scope="module")
def draft(tmp_path_factory) -> Path:
    harness.require_file(GGUF, "the default model (make models)")
    out = tmp_path_factory.mktemp("draft") / "smollm2-draft6.gguf"
    subprocess.run([sys.executable, str(MAKE_DRAFT), "--gguf", str(GGUF), "--layers", "6",
                    "--out", str(out)], check=True, timeout=300)
    return out


@pytest.fixture(scope="module")
def server(draft):
    s = harness.Server.start([str(harness.GYRE_BIN), "serve", "--model", str(GGUF),
                              "--draft-model", str(draft),
                              "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"])
    yield s
    s.stop()
    assert_no_panic(s)
    s.remove_log()


@pytest.fixture(scope="module")
def sdk(server):
    return openai.OpenAI(base_url=f"http://{server.http}/v1", api_key="unused", max_retries=0,
                         timeout=300)


COUNTS = {"speculative_proposed_tokens_total": "speculativeProposedTokensTotal",
          "speculative_accepted_tokens_total": "speculativeAcceptedTokensTotal",
          "draft_proposed_tokens_total": "draftProposedTokensTotal",
          "draft_accepted_tokens_total": "draftAcceptedTokensTotal",
          "draft_forwards_total": "draftForwardsTotal",
          "draft_kv_blocks_total": "draftKvBlocksTotal",
          "draft_kv_blocks_used": "draftKvBlocksUsed"}


def stats(server) -> dict:
    r = harness.buf_curl(server.grpc, "gyre.v1.Generation/GetStats", {}).ok()
    m = r.messages[0]
    return {k: int(m.get(c, 0)) for k, c in COUNTS.items()}


def chat(sdk, **extra):
    r = sdk.chat.completions.create(model="", messages=MESSAGES, temperature=0, max_tokens=60,
                                    extra_body=extra)
    return r.choices[0].message.content, r.usage


def test_the_draft_changes_no_token_and_is_counted(server, sdk):
    plain, plain_usage = chat(sdk, num_assistant_tokens=0)
    assert plain_usage.completion_tokens_details is None, plain_usage
    for extra in [{}, {"num_assistant_tokens": 3}, {"num_assistant_tokens": 8},
                  {"assistant_confidence_threshold": 0.3}]:
        before = stats(server)
        text, usage = chat(sdk, **extra)
        after = stats(server)
        assert text == plain, extra
        proposed = after["draft_proposed_tokens_total"] - before["draft_proposed_tokens_total"]
        accepted = after["draft_accepted_tokens_total"] - before["draft_accepted_tokens_total"]
        assert proposed > 0 and after["draft_forwards_total"] > before["draft_forwards_total"]
        d = usage.completion_tokens_details
        assert (d.accepted_prediction_tokens, d.rejected_prediction_tokens) == (
            accepted, proposed - accepted), (extra, d, proposed, accepted)
        print(f"{extra}: {accepted} of {proposed} draft proposals accepted")
    s = stats(server)
    assert s["draft_kv_blocks_total"] > 0 and s["draft_kv_blocks_used"] == 0, s


def test_max_ngram_size_picks_prompt_lookup(server, sdk):
    before = stats(server)
    text, _ = chat(sdk, max_ngram_size=2, num_assistant_tokens=4)
    after = stats(server)
    assert after["draft_proposed_tokens_total"] == before["draft_proposed_tokens_total"]
    plain, _ = chat(sdk, num_assistant_tokens=0)
    assert text == plain


def test_over_grpc(server):
    text = "The keeper of the lighthouse said:"

    def generate(extra):
        body = {"text": text, "sampling": {"temperature": 0}, "max_tokens": 40, **extra}
        r = harness.buf_curl(server.grpc, "gyre.v1.Generation/GenerateStream", body).ok()
        usage = [m["finish"]["usage"] for m in r.messages if "finish" in m]
        assert len(usage) == 1, r.messages
        return "".join(m.get("delta", {}).get("text", "") for m in r.messages), usage[0]

    plain, plain_usage = generate({"num_assistant_tokens": 0})
    assert "speculativeProposedTokens" not in plain_usage, plain_usage
    before = stats(server)
    fast, usage = generate({"num_assistant_tokens": 4})
    after = stats(server)
    assert fast and fast == plain
    proposed = after["draft_proposed_tokens_total"] - before["draft_proposed_tokens_total"]
    assert int(usage["speculativeProposedTokens"]) == proposed > 0, usage
    confident, _ = generate({"assistant_confidence_threshold": 0.5})
    assert confident == plain
    both = harness.buf_curl(server.grpc, "gyre.v1.Generation/GenerateStream",
                            {"text": "hi", "max_tokens": 2, "num_assistant_tokens": 3,
                             "assistant_confidence_threshold": 0.5})
    assert both.rc != 0 and both.error["code"] == "invalid_argument", both.error
    assert "assistant_confidence_threshold" in both.error["message"], both.error


@pytest.mark.parametrize("extra,param", [
    ({"num_assistant_tokens": 3, "assistant_confidence_threshold": 0.5},
     "assistant_confidence_threshold"),
    ({"assistant_confidence_threshold": 1.5}, "assistant_confidence_threshold"),
    ({"assistant_confidence_threshold": -0.1}, "assistant_confidence_threshold"),
    ({"assistant_confidence_threshold": 0.5, "max_ngram_size": 2},
     "assistant_confidence_threshold"),
    ({"num_assistant_tokens": 65}, "num_assistant_tokens"),
])
def test_bad_parameters_are_400s_naming_the_param(sdk, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        sdk.chat.completions.create(model="", messages=MESSAGES, max_tokens=2, extra_body=extra)
    assert e.value.body["param"] == param, e.value.body


def test_a_draft_with_another_vocabulary_fails_the_start():
    harness.require_file(GGUF, "the default model (make models)")
    other = harness.MODELS / "tiny-llama"
    harness.require_file(other / "config.json", "the fixture models (make models)")
    p = subprocess.run([str(harness.GYRE_BIN), "serve", "--model", str(GGUF),
                        "--draft-model", str(other),
                        "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"],
                       capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert p.returncode != 0 and "listening" not in p.stdout, (p.returncode, p.stderr[-2000:])
    assert "vocabulary differs" in p.stderr, p.stderr[-2000:]
    assert "panicked" not in p.stderr


@pytest.mark.parametrize("defaults,speculates", [({"num_assistant_tokens": 0}, False),
                                                 ({"num_assistant_tokens": 2}, True),
                                                 ({"assistant_confidence_threshold": 1.0}, False)])
def test_generation_config_sets_the_default(tmp_path, defaults, speculates):
    """A fixture model (tiny-llama) with tiny-mistral (same tokenizer) as its
    draft: the model's generation_config.json decides whether a request that
    says nothing speculates; a request's own value still wins."""
    src = harness.MODELS / "tiny-llama"
    harness.require_file(src / "config.json", "the fixture models (make models)")
    model = tmp_path / "tiny-llama"
    shutil.copytree(src, model, symlinks=True)
    cfg = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**cfg, **defaults}))
    s = harness.Server.start([str(harness.GYRE_BIN), "serve", "--model", str(model),
                              "--draft-model", str(harness.MODELS / "tiny-mistral"),
                              "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"])
    try:
        def usage(extra):
            body = {"token_ids": {"ids": [1, 306, 763, 278]}, "sampling": {"temperature": 0},
                    "max_tokens": 12, "ignore_eos": True, **extra}
            r = harness.buf_curl(s.grpc, "gyre.v1.Generation/GenerateStream", body).ok()
            return [m["finish"]["usage"] for m in r.messages if "finish" in m][0]
        assert ("speculativeProposedTokens" in usage({})) == speculates, defaults
        assert "speculativeProposedTokens" in usage({"num_assistant_tokens": 3})
        if defaults.get("num_assistant_tokens") == 2:
            # At most 2 proposals a step: 12 tokens take at least 4 steps.
            assert int(usage({})["speculativeProposedTokens"]) <= 2 * 11
    finally:
        s.stop()
    assert_no_panic(s)
    s.remove_log()


def test_beam_search_does_not_use_the_draft(server, sdk):
    before = stats(server)
    r = sdk.completions.create(model="", prompt="The lighthouse keeper", best_of=2, n=1,
                               max_tokens=8, temperature=0)
    assert r.choices[0].text
    after = stats(server)
    assert after["draft_proposed_tokens_total"] == before["draft_proposed_tokens_total"]
    # Asking for both is refused, naming the parameter.
    with pytest.raises(openai.BadRequestError) as e:
        sdk.completions.create(model="", prompt="The lighthouse keeper", best_of=2, n=1,
                               max_tokens=8, temperature=0,
                               extra_body={"num_assistant_tokens": 3})
    assert e.value.body["param"] == "num_assistant_tokens", e.value.body
