"""The TypeScript client package (`clients/typescript`, `gyre-client`) against
a live gyre serving the real default model (SmolLM2-135M-Instruct).

The package is built the way a fresh clone builds it (tests/ts_package.py).
A small ESM app imports it by package name (`gyre-client`,
`gyre-client/node`, `gyre-client/web`) and runs the checks
of `tests/node/typescript_client.mjs`, each over gRPC (connect-node,
HTTP/2) and over gRPC-Web (connect-web over Node's fetch, HTTP/1.1, to the
same gRPC port): greedy `generate` equals the HTTP API's completion, the
pieces of `stream` join to it, aborting a stream's AbortSignal (or leaving
its loop) ends it and the engine lets the request go (GetStats running
back to 0), an unknown model is a ConnectError with code NotFound,
`models`/`stats`/`health` agree with the server, and a server started with
--api-key refuses calls without the key and serves them with it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

import harness
import ts_package
from conftest import API_KEY, QWEN

SCRIPT = harness.REPO / "tests" / "node" / "typescript_client.mjs"
GGUF = "smollm2-135m-instruct.gguf"
MODEL = "smollm2-135m-instruct"
PROMPT = "The capital of France is"
PROTOCOLS = ("grpc", "grpcweb")


@pytest.fixture(scope="module")
def app(tmp_path_factory) -> Path:
    """An app folder whose node_modules/gyre-client is the package built from a fresh copy."""
    pkg = ts_package.build_fresh(tmp_path_factory.mktemp("clone"))
    app = ts_package.app_folder(tmp_path_factory.mktemp("app"), pkg)
    shutil.copy(SCRIPT, app / SCRIPT.name)
    return app


def run(app: Path, protocol: str, address: str, check: str, **args) -> dict:
    argv = [ts_package.node(), str(app / SCRIPT.name), protocol, f"http://{address}", check, json.dumps(args)]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=app)
    assert p.returncode == 0, f"{check} over {protocol}:\n{p.stderr}"
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def smol(module_server) -> harness.Server:
    return module_server(GGUF)


def http_completion(server: harness.Server, **body) -> dict:
    r = harness.http_json(server.http, "/v1/completions", {"model": MODEL, "temperature": 0, **body})
    assert r.status == 200, r.body
    return r.json()


GREEDY = {"maxTokens": 16, "temperature": 0}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_generate_greedy_equals_the_http_api(app, smol, protocol):
    ref = http_completion(smol, prompt=PROMPT, max_tokens=16)
    choice = ref["choices"][0]
    c = run(app, protocol, smol.grpc, "generate", prompt=PROMPT, options=GREEDY)["completion"]
    assert c["text"] == choice["text"] and c["text"].strip(), (c, choice)
    assert c["finishReason"] == choice["finish_reason"]
    assert [c["usage"]["promptTokens"], c["usage"]["completionTokens"]] == \
        [ref["usage"]["prompt_tokens"], ref["usage"]["completion_tokens"]]
    assert len(c["tokenIds"]) == c["usage"]["completionTokens"]
    assert c["model"] == MODEL and c["requestId"], c


def test_generate_from_token_ids(app, smol):
    tok = harness.buf_curl(smol.grpc, "gyre.v1.Generation/Tokenize", {"model": MODEL, "text": PROMPT}).ok()
    ids = [int(t) for t in tok.messages[0]["tokenIds"]]
    out = run(app, "grpc", smol.grpc, "generate", prompt=PROMPT, options=GREEDY, ids=ids)
    assert out["fromIds"]["text"] == out["completion"]["text"]
    assert out["fromIds"]["usage"]["promptTokens"] == len(ids)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_stream_pieces_join_to_the_generated_text(app, smol, protocol):
    whole = run(app, protocol, smol.grpc, "generate", prompt=PROMPT, options=GREEDY)["completion"]
    out = run(app, protocol, smol.grpc, "stream", prompt=PROMPT, options=GREEDY)
    pieces = out["pieces"]
    assert len(pieces) > 1, pieces
    assert "".join(p["text"] for p in pieces) == whole["text"]
    assert [t for p in pieces for t in p["tokenIds"]] == whole["tokenIds"]
    assert out["completion"]["usage"]["completionTokens"] == whole["usage"]["completionTokens"]
    assert out["completion"]["finishReason"] == whole["finishReason"]
    assert out["completion"]["text"] == whole["text"]


LONG = {"maxTokens": 4000, "ignoreEos": True}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_aborting_a_stream_ends_it_and_frees_the_request(app, smol, protocol):
    out = run(app, protocol, smol.grpc, "abort", prompt="Story:", options=LONG, model=MODEL)
    assert out["firstIds"], out
    # It was running when aborted, and far from its 4000 tokens.
    assert out["runningBefore"] >= 1, out
    assert out["ended"] == "error" and out["error"]["code"] == "Canceled", out
    assert out["pieces"] == 1 and out["completion"] is None, out
    st = out["stats"]
    assert st["running"] == 0 and st["waiting"] == 0 and st["kvBlocksUsed"] == 0, st


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_leaving_a_stream_early_frees_the_request(app, smol, protocol):
    out = run(app, protocol, smol.grpc, "leave", prompt="Story:", options=LONG, model=MODEL)
    assert out["pieces"] == 1 and out["runningBefore"] >= 1 and out["completion"] is None, out
    st = out["stats"]
    assert st["running"] == 0 and st["waiting"] == 0 and st["kvBlocksUsed"] == 0, st


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_unknown_model_is_not_found(app, smol, protocol):
    out = run(app, protocol, smol.grpc, "unknown-model")
    for call in ("generate", "stats", "health"):
        assert out[call].get("error", {}).get("code") == "NotFound", (call, out[call])
    assert "no-such-model" in out["generate"]["error"]["rawMessage"], out


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_models_stats_and_health(app, smol, protocol):
    out = run(app, protocol, smol.grpc, "info", model=MODEL)
    listed = harness.buf_curl(smol.grpc, "gyre.v1.Generation/ListModels", {}).ok().messages[0]["models"]
    assert [m["id"] for m in out["models"]] == [m["id"] for m in listed] and MODEL in listed[0]["id"], out
    (model,) = [m for m in out["models"] if m["id"] == MODEL]
    assert model["maxModelLen"] > 0 and model["vocabSize"] == 49152, model
    st = out["stats"]
    assert st["model"] == MODEL and st["kvBlocksTotal"] > 0 and st["blockSize"] > 0, st
    assert out["health"] == "SERVING" and out["healthModel"] == "SERVING", out


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_api_key_is_required_and_accepted(app, keyed, protocol):
    out = run(app, protocol, keyed.grpc, "auth", key=API_KEY)
    assert out["none"].get("error", {}).get("code") == "Unauthenticated", out["none"]
    assert out["wrong"].get("error", {}).get("code") == "Unauthenticated", out["wrong"]
    assert QWEN in [m["id"] for m in out["right"]["ok"]], out["right"]
    assert out["generate"]["ok"]["usage"]["completionTokens"] == 3, out["generate"]
    # grpc.health.v1 never needs the key.
    assert out["health"] == {"ok": "SERVING"}, out["health"]
