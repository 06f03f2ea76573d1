"""The standalone deployment: `gyre grpc` plus a separate `gyre-shim`.

The shim is only a gRPC client, so the same OpenAI behaviour must hold across
two processes: the served model name, transformers-exact greedy output, the
API key required on HTTP and forwarded to the (keyed) gRPC service, and, once
the gRPC service is gone, a 503 `server_error` instead of a hang or a 500.
"""

from __future__ import annotations

import openai
import pytest

import harness
import openai_schema
from conftest import API_KEY, QWEN, assert_no_panic

ALIAS = "qwen-alias"


@pytest.fixture(scope="module")
def pair():
    grpc = harness.Server.start(
        [str(harness.GYRE_BIN), "grpc", "--model", str(harness.model_dir(QWEN)), "--grpc-addr", "127.0.0.1:0",
         "--served-model-name", ALIAS, "--api-key", API_KEY],
        want=("gRPC",),
    )
    try:
        shim = harness.Server.start(
            [str(harness.SHIM_BIN), "--grpc-endpoint", f"http://{grpc.grpc}", "--http-addr", "127.0.0.1:0",
             "--api-key", API_KEY],
            want=("HTTP",),
        )
    except BaseException:
        grpc.stop()
        raise
    yield grpc, shim
    shim.stop()
    grpc.stop()
    try:
        assert_no_panic(grpc)
        assert_no_panic(shim)
    finally:
        grpc.remove_log()
        shim.remove_log()


def sdk(shim: harness.Server, key: str = API_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{shim.http}/v1", api_key=key, max_retries=0, timeout=60)


def test_served_model_name(pair):
    _, shim = pair
    ids = [m.id for m in sdk(shim).models.list().data]
    assert ids == [ALIAS]
    with pytest.raises(openai.NotFoundError):
        sdk(shim).completions.create(model=QWEN, prompt="Hi", max_tokens=2)


def test_greedy_output_matches_transformers(pair):
    _, shim = pair
    gold = harness.golden(QWEN)
    r = sdk(shim).completions.create(model=ALIAS, prompt=gold["prompt_ids"], max_tokens=32, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert r.choices[0].text == gold["greedy_text"]
    assert (r.choices[0].finish_reason, r.usage.completion_tokens) == ("length", 32)


def test_chat_stream_through_standalone_shim(pair):
    _, shim = pair
    chunks = list(sdk(shim).chat.completions.create(
        model=ALIAS, messages=[{"role": "user", "content": "Hi"}], max_tokens=5, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["length"]


def test_wrong_key_rejected_by_shim(pair):
    _, shim = pair
    with pytest.raises(openai.AuthenticationError):
        sdk(shim, "wrong").models.list()


def test_grpc_service_gone_is_503(pair):
    grpc, shim = pair
    grpc.stop()
    reply = harness.http_json(shim.http, "/v1/completions", {"model": ALIAS, "prompt": "Hi", "max_tokens": 2},
                              headers={"Authorization": f"Bearer {API_KEY}"})
    assert reply.status == 503, (reply.status, reply.body)
    body = reply.json()
    openai_schema.validate(openai_schema.ERROR, body)
    assert body["error"]["type"] == "server_error"
    assert shim.alive()
