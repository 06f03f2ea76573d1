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
vocabulary fails the start. vLLM's `--speculative-config '{"model": ...,
"num_speculative_tokens": 3}'` serves the draft with 3 tokens a step by
default, and the admin API's `LoadModel` loads a model with a draft (its
`draft_tokens` the default), refusing one with another vocabulary.
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
          "draft_kv_blocks_used": "draftKvBlocksUsed",
          "steps_total": "stepsTotal"}


def stats(server, model: str = "") -> dict:
    r = harness.buf_curl(server.grpc, "gyre.v1.Generation/GetStats", {"model": model}).ok()
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


def test_vllms_config_serves_the_draft_with_its_tokens_per_step(draft):
    config = {"model": str(draft), "num_speculative_tokens": 3}
    s = harness.Server.start([str(harness.GYRE_BIN), "serve", "--model", str(GGUF),
                              "--speculative-config", json.dumps(config),
                              "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"])
    try:
        sdk = openai.OpenAI(base_url=f"http://{s.http}/v1", api_key="unused", max_retries=0,
                            timeout=300)
        plain, _ = chat(sdk, num_assistant_tokens=0)
        before = stats(s)
        text, usage = chat(sdk)
        after = stats(s)
        assert text == plain
        delta = {k: after[k] - before[k] for k in after}
        proposed, steps = delta["draft_proposed_tokens_total"], delta["steps_total"]
        assert proposed > 0 and delta["draft_forwards_total"] > 0, delta
        d = usage.completion_tokens_details
        assert d.accepted_prediction_tokens + d.rejected_prediction_tokens == proposed, (d, delta)
        # 3 proposals a step: never more, and fewer only in the prefill step
        # and the last steps that max_tokens cuts short (this layer-truncated
        # draft is rarely right, so there are many steps).
        assert steps > 12 and 2 * steps < proposed <= 3 * steps, delta
        # The same as a request that sends 3 itself, not the default 5.
        _, three = chat(sdk, num_assistant_tokens=3)
        _, five = chat(sdk, num_assistant_tokens=5)
        assert three.completion_tokens_details == d, (three, usage)
        assert five.completion_tokens_details != d, (five, usage)
        print(f"--speculative-config draft: {proposed} proposals in {steps} steps")
    finally:
        s.stop()
    assert_no_panic(s)
    s.remove_log()


ADMIN_KEY = "admin-key"
ADMIN = [f"authorization: Bearer {ADMIN_KEY}"]


@pytest.fixture(scope="module")
def admin_server():
    llama = harness.model_dir("tiny-llama")
    harness.require_file(llama / "config.json", "the fixture models (make models)")
    s = harness.Server.start([str(harness.GYRE_BIN), "serve", "--model", f"{llama},name=chat",
                              "--kv-cache-mib", "16", "--admin-api-key", ADMIN_KEY,
                              "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"])
    yield s
    s.stop()
    assert_no_panic(s)
    s.remove_log()


def admin(server, method: str, body: dict) -> harness.BufResult:
    return harness.buf_curl(server.grpc, f"gyre.v1.Admin/{method}", body, headers=ADMIN)


def served(server) -> dict:
    return {m["model"]["id"]: m for m in admin(server, "ListModels", {}).ok().messages[0]["models"]}


def test_the_admin_api_loads_a_model_with_a_draft(admin_server):
    """tiny-llama drafted by tiny-mistral (the same tokenizer, weights of
    its own), 3 draft tokens a step by default."""
    s = admin_server
    llama, mistral = harness.model_dir("tiny-llama"), harness.model_dir("tiny-mistral")
    loaded = admin(s, "LoadModel", {"source": str(llama), "name": "drafted", "kv_cache_mib": 16,
                                    "draft": str(mistral), "draft_tokens": 3}).ok()
    assert loaded.messages[0]["model"]["id"] == "drafted"
    listed = served(s)
    assert listed["drafted"]["draft"] == str(mistral), listed["drafted"]
    assert "draft" not in listed["chat"], listed["chat"]
    # The draft's pool counts in its KV bytes.
    assert int(listed["drafted"]["kvCacheBytes"]) > int(listed["chat"]["kvCacheBytes"]), listed

    def usage(model, extra):
        body = {"model": model, "token_ids": {"ids": [1, 306, 763, 278]},
                "sampling": {"temperature": 0}, "max_tokens": 16, "ignore_eos": True, **extra}
        r = harness.buf_curl(s.grpc, "gyre.v1.Generation/GenerateStream", body).ok()
        text = "".join(m.get("delta", {}).get("text", "") for m in r.messages)
        return text, [m["finish"]["usage"] for m in r.messages if "finish" in m][0]

    before = stats(s, "drafted")
    text, u = usage("drafted", {})
    after = stats(s, "drafted")
    proposed = after["draft_proposed_tokens_total"] - before["draft_proposed_tokens_total"]
    steps = after["steps_total"] - before["steps_total"]
    assert int(u["speculativeProposedTokens"]) == proposed > 0, (u, after, before)
    assert proposed <= 3 * steps, (proposed, steps)
    assert after["draft_kv_blocks_total"] > 0 and after["draft_forwards_total"] > 0, after
    # 3 is the default: a request sending 3 proposes the same; one sending 5
    # proposes more; greedy output is the plain model's either way.
    same, u3 = usage("drafted", {"num_assistant_tokens": 3})
    spec = ("speculativeProposedTokens", "speculativeAcceptedTokens")
    assert same == text and [u3.get(k) for k in spec] == [u.get(k) for k in spec], (u3, u)
    _, u5 = usage("drafted", {"num_assistant_tokens": 5})
    assert int(u5["speculativeProposedTokens"]) > proposed, (u5, u)
    plain, plain_usage = usage("chat", {})
    assert plain == text and "speculativeProposedTokens" not in plain_usage, plain_usage
    assert stats(s, "chat")["draft_kv_blocks_total"] == 0


def test_the_admin_api_refuses_a_draft_with_another_vocabulary(admin_server):
    s = admin_server
    qwen, llama = harness.model_dir("tiny-qwen2"), harness.model_dir("tiny-llama")
    r = admin(s, "LoadModel", {"source": str(qwen), "name": "mismatch", "kv_cache_mib": 16,
                               "draft": str(llama)})
    assert r.rc != 0 and r.error["code"] == "invalid_argument", r.error
    assert "vocabulary differs" in r.error["message"] and "vocab_size" in r.error["message"], r.error
    missing = admin(s, "LoadModel", {"source": str(qwen), "name": "mismatch",
                                     "draft": "/nonexistent/draft.gguf"})
    assert missing.error["code"] == "invalid_argument" and "draft" in missing.error["message"], missing.error
    no_draft = admin(s, "LoadModel", {"source": str(qwen), "name": "mismatch", "draft_tokens": 3})
    assert no_draft.error["code"] == "invalid_argument", no_draft.error
    assert "draft_tokens needs a draft model" in no_draft.error["message"], no_draft.error
    assert "mismatch" not in served(s)
    assert harness.buf_curl(s.grpc, "gyre.v1.Generation/GetStats", {"model": "mismatch"}).error[
        "code"] == "not_found"
