"""Several models in one `gyre serve`: the catalogue, routing by name and
alias, unknown models, deprecation headers, Dynamo's listing, per-model
health, the config file, and the start-time memory check.

One server serves tiny-llama as `chat` (alias `gpt-4o-mini`, a pinned
version) and tiny-qwen2 as `legacy` (alias `legacy-latest`, deprecated with a
sunset date, its own owner). The two models have different tokenizers, so a
request's token ids show which model served it.
"""

from __future__ import annotations

import json
import subprocess
from datetime import datetime, timezone

import openai
import pytest
from tokenizers import Tokenizer

import harness
from conftest import assert_no_panic

DEPRECATED = "2026-01-01"
SUNSET = "2027-03-31"


def unix(date: str) -> int:
    return int(datetime.fromisoformat(date).replace(tzinfo=timezone.utc).timestamp())


def serve_argv(*extra: str) -> list[str]:
    return [str(harness.GYRE_BIN), "serve", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0",
            "--kv-cache-mib", "16", *extra]


def specs() -> list[str]:
    llama, qwen = harness.model_dir("tiny-llama"), harness.model_dir("tiny-qwen2")
    return ["--model", f"{llama},name=chat,alias=gpt-4o-mini,version=2026-11-01",
            "--model", f"{qwen},name=legacy,alias=legacy-latest,deprecated={DEPRECATED},"
                       f"sunset={SUNSET},owned_by=acme"]


@pytest.fixture(scope="module")
def multi():
    server = harness.Server.start(serve_argv(*specs()))
    yield server
    server.stop()
    assert_no_panic(server)
    server.remove_log()


@pytest.fixture(scope="module")
def sdk(multi):
    return openai.OpenAI(base_url=f"http://{multi.http}/v1", api_key="unused", max_retries=0, timeout=120)


def own_ids(model: str, text: str) -> list[int]:
    """`text` tokenized by the model's own tokenizer.json (special tokens as its post-processor adds)."""
    tok = Tokenizer.from_file(str(harness.model_dir(model) / "tokenizer.json"))
    return tok.encode(text).ids


def test_the_catalogue_lists_both_models_with_their_fields(multi, sdk):
    assert [m.id for m in sdk.models.list().data] == ["chat", "legacy"]
    body = harness.http_json(multi.http, "/v1/models").json()
    chat, legacy = body["data"]
    assert (chat["aliases"], chat["version"], chat["deprecation"], chat["sunset"]) == (
        ["gpt-4o-mini"], "2026-11-01", None, None)
    assert (chat["owned_by"], chat["kind"], chat["chat"]) == ("gyre", "generate", True)
    assert (legacy["aliases"], legacy["owned_by"]) == (["legacy-latest"], "acme")
    assert (legacy["deprecation"], legacy["sunset"]) == (unix(DEPRECATED), unix(SUNSET))
    # An alias retrieves the model it resolves to.
    assert sdk.models.retrieve("gpt-4o-mini").id == "chat"
    assert sdk.models.retrieve("legacy-latest").id == "legacy"
    # gRPC ListModels carries the same catalogue.
    grpc = harness.buf_curl(multi.grpc, "gyre.v1.Generation/ListModels", {}).ok().messages[0]["models"]
    assert [(m["id"], m.get("aliases")) for m in grpc] == [("chat", ["gpt-4o-mini"]), ("legacy", ["legacy-latest"])]
    assert grpc[0]["version"] == "2026-11-01"
    assert int(grpc[1]["deprecation"]) == unix(DEPRECATED) and int(grpc[1]["sunset"]) == unix(SUNSET)
    assert [m["architecture"] for m in grpc] == ["LlamaForCausalLM", "Qwen2ForCausalLM"]


@pytest.mark.parametrize("name,model,served", [
    ("chat", "tiny-llama", "chat"), ("gpt-4o-mini", "tiny-llama", "chat"),
    ("legacy", "tiny-qwen2", "legacy"), ("legacy-latest", "tiny-qwen2", "legacy"),
])
def test_requests_route_by_name_and_alias(multi, sdk, name, model, served):
    text = "The quick brown fox jumps over the lazy dog"
    # Completions: the prompt is tokenized by the model the name resolves to,
    # and the response names that model's id even when asked by alias.
    r = sdk.completions.create(model=name, prompt=text, max_tokens=4, temperature=0)
    assert r.model == served
    assert r.usage.prompt_tokens == len(own_ids(model, text))
    # Tokenize (vLLM's route) returns that model's ids.
    tok = harness.http_json(multi.http, "/tokenize", {"model": name, "prompt": text}).json()
    assert tok["tokens"] == own_ids(model, text)
    # Chat through the SDK, streamed and not, names the pinned id too.
    messages = [{"role": "user", "content": "Hello"}]
    c = sdk.chat.completions.create(model=name, messages=messages, max_tokens=4, temperature=0)
    assert c.model == served
    chunks = list(sdk.chat.completions.create(model=name, messages=messages, max_tokens=4, temperature=0,
                                              stream=True))
    assert chunks and all(ch.model == served for ch in chunks)
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == c.choices[0].message.content


def test_an_alias_answers_exactly_as_its_model(sdk):
    kw = dict(messages=[{"role": "user", "content": "Count to five"}], max_tokens=12, temperature=0)
    by_alias = sdk.chat.completions.create(model="gpt-4o-mini", **kw).choices[0].message.content
    by_name = sdk.chat.completions.create(model="chat", **kw).choices[0].message.content
    assert by_alias == by_name


def test_an_unknown_model_is_404_model_not_found_everywhere(multi, sdk):
    with pytest.raises(openai.NotFoundError) as exc:
        sdk.chat.completions.create(model="gpt-5", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert exc.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError) as exc:
        sdk.completions.create(model="gpt-5", prompt="hi", max_tokens=2)
    assert exc.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        sdk.models.retrieve("gpt-5")
    for path, body in [("/tokenize", {"model": "gpt-5", "prompt": "hi"}),
                       ("/detokenize", {"model": "gpt-5", "tokens": [1]})]:
        reply = harness.http_json(multi.http, path, body)
        assert reply.status == 404, reply.body
        assert reply.json() == {"error": {"message": "the model `gpt-5` does not exist",
                                          "type": "invalid_request_error", "param": "model",
                                          "code": "model_not_found"}}
    grpc = harness.buf_curl(multi.grpc, "gyre.v1.Generation/GenerateStream",
                            {"model": "gpt-5", "text": "hi", "max_tokens": 2})
    assert grpc.rc != 0 and grpc.error["code"] == "not_found", grpc.stderr


def test_a_deprecated_model_answers_with_deprecation_and_sunset_headers(multi):
    want = {"deprecation": f"@{unix(DEPRECATED)}", "sunset": "Wed, 31 Mar 2027 00:00:00 GMT"}
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for name in ("legacy", "legacy-latest"):
        plain = harness.http_json(multi.http, "/v1/chat/completions", {"model": name, **chat})
        assert plain.status == 200, plain.body
        assert {k: plain.headers.get(k) for k in want} == want
        streamed = harness.http_sse(multi.http, "/v1/chat/completions", {"model": name, "stream": True, **chat})
        assert streamed.status == 200 and streamed.done
        assert {k: streamed.headers.get(k) for k in want} == want
        completion = harness.http_json(multi.http, "/v1/completions", {"model": name, "prompt": "a", "max_tokens": 2})
        assert {k: completion.headers.get(k) for k in want} == want
        tok = harness.http_json(multi.http, "/tokenize", {"model": name, "prompt": "a"})
        assert {k: tok.headers.get(k) for k in want} == want
    # A model that is not deprecated carries neither header.
    current = harness.http_json(multi.http, "/v1/chat/completions", {"model": "gpt-4o-mini", **chat})
    assert current.status == 200
    assert "deprecation" not in current.headers and "sunset" not in current.headers
    # gRPC clients get the same notice as response metadata.
    grpc = harness.buf_curl(multi.grpc, "gyre.v1.Generation/Tokenize", {"model": "legacy-latest", "text": "a"},
                            extra=["-v"]).ok()
    assert f"deprecation: @{unix(DEPRECATED)}" in grpc.stderr.lower(), grpc.stderr
    # And every such request is logged.
    assert "request for a deprecated model" in multi.stderr()


def test_dynamo_list_models_returns_the_catalogue(multi):
    reply = harness.http_json(multi.http, "/dynamo/alpha/list-models")
    assert reply.status == 200
    body = reply.json()
    names = ["chat", "gpt-4o-mini", "legacy", "legacy-latest"]
    assert body["chat_completion_models"] == names
    assert body["completion_models"] == names
    assert body["data"] == harness.http_json(multi.http, "/v1/models").json()["data"]


def test_health_is_reported_per_model_name_and_alias(multi):
    for name in ("chat", "gpt-4o-mini", "legacy", "legacy-latest"):
        r = harness.buf_curl(multi.grpc, "grpc.health.v1.Health/Check", {"service": name}).ok()
        assert r.messages == [{"status": "SERVING"}], name
    unknown = harness.buf_curl(multi.grpc, "grpc.health.v1.Health/Check", {"service": "gpt-5"})
    assert unknown.error["code"] == "not_found"


def test_the_admin_service_is_off_without_an_admin_key(multi):
    r = harness.buf_curl(multi.grpc, "gyre.v1.Admin/ListModels", {}, headers=["authorization: Bearer x"])
    assert r.error["code"] == "unimplemented", r.stderr
    assert "--admin-api-key" in r.error["message"]


def test_a_config_file_serves_the_same_catalogue(tmp_path):
    llama, qwen = harness.model_dir("tiny-llama"), harness.model_dir("tiny-qwen2")
    config = tmp_path / "models.toml"
    config.write_text(f"""
[[models]]
source = {json.dumps(str(llama))}
name = "chat"
aliases = ["gpt-4o-mini", "small"]
version = "2026-11-01"

[[models]]
source = {json.dumps(str(qwen))}
name = "legacy"
deprecated = "{DEPRECATED}"
kv_cache_mib = 8
""")
    server = harness.Server.start(serve_argv("--config", str(config)))
    try:
        data = harness.http_json(server.http, "/v1/models").json()["data"]
        assert [(m["id"], m["aliases"], m["version"], m["deprecation"]) for m in data] == [
            ("chat", ["gpt-4o-mini", "small"], "2026-11-01", None), ("legacy", [], "", unix(DEPRECATED))]
        r = harness.http_json(server.http, "/v1/completions", {"model": "small", "prompt": "a", "max_tokens": 2})
        assert r.status == 200 and r.json()["model"] == "chat"
        admin = harness.buf_curl(server.grpc, "gyre.v1.Generation/GetStats", {"model": "legacy"}).ok()
        # kv_cache_mib = 8 gives legacy a smaller pool than chat's 16 MiB.
        chat_stats = harness.buf_curl(server.grpc, "gyre.v1.Generation/GetStats", {"model": "chat"}).ok()
        assert admin.messages[0]["kvBlocksTotal"] < chat_stats.messages[0]["kvBlocksTotal"]
    finally:
        server.stop()
        assert_no_panic(server)
        server.remove_log()


def failed_start(*extra: str) -> subprocess.CompletedProcess:
    """Runs a `gyre serve` that must fail before binding any port."""
    p = subprocess.run(serve_argv(*extra), capture_output=True, text=True, timeout=120,
                       cwd=harness.REPO, stdin=subprocess.DEVNULL)
    assert p.returncode == 1, (p.returncode, p.stderr[-2000:])
    assert "listening" not in p.stdout
    assert "panicked" not in p.stderr
    return p


def test_a_model_that_does_not_fit_the_device_memory_fails_the_start():
    llama, qwen = harness.model_dir("tiny-llama"), harness.model_dir("tiny-qwen2")
    # 100 MiB of (configured) device memory: tiny-llama (16 MiB of f32
    # weights) with a 16 MiB KV cache fits; tiny-qwen2 (37 MiB) with its
    # full-context cache (64 running sequences of 2048 tokens: 64 MiB) does
    # not fit in what is left.
    p = failed_start("--device-memory-mib", "100", "--model", f"{llama},name=small,kv_cache_mib=16",
                     "--model", f"{qwen},name=big,kv_cache_mib=512")
    assert "model `big` does not fit in device memory" in p.stderr, p.stderr[-2000:]
    assert "after 32.0 MiB promised to the models before it" in p.stderr
    assert "short by" in p.stderr
    # Alone, the first model starts under the same limit.
    ok = harness.Server.start(serve_argv("--device-memory-mib", "100", "--model", f"{llama},name=small"))
    ok.stop()
    ok.remove_log()


def test_bad_model_lists_fail_the_start_with_a_clear_message():
    llama = harness.model_dir("tiny-llama")
    p = failed_start("--model", f"{llama},name=a", "--model", f"{llama},name=b,alias=a")
    assert "the model name `a` is given twice" in p.stderr
    p = failed_start("--model", f"{llama},name=a", "--model", f"{llama},name=b", "--served-model-name", "x")
    assert "--served-model-name and --revision apply to a single model" in p.stderr
    p = failed_start("--model", f"{llama},nickname=a")
    assert "unknown key `nickname`" in p.stderr
    p = failed_start("--model", f"{llama},deprecated=next-week")
    assert "is not a date" in p.stderr
