"""One `gyre serve` with the real default chat model and the real
all-MiniLM-L6-v2 side by side (issue 13's "done when"): both listed by
`/v1/models`, chat answered as transformers answers on the default model,
embeddings equal to sentence-transformers', each through the official SDK,
and each model refusing the other's route with a 400 naming `model`.

The embedding model is a catalogue entry like the chat model: it answers to
an alias, carries a version and deprecation notices, has its own gRPC
health, and the admin service loads and unloads embedding models while the
server runs.
"""

from __future__ import annotations

import json

import numpy as np
import openai
import pytest

import harness

CHAT = "smollm2-135m-instruct"
EMBED = "all-minilm-l6-v2"
EMBED_ALIAS = "text-embedding-3-small"
ADMIN_KEY = "admin-key"
REFS = harness.REPO / ".gyre" / "gguf-ref" / "manifest.json"


@pytest.fixture(scope="module")
def server():
    s = harness.Server.start([str(harness.GYRE_BIN), "serve",
                              "--model", str(harness.REPO / ".gyre" / "models" / f"{CHAT}.gguf"),
                              "--model", f"{harness.model_dir(EMBED)},alias={EMBED_ALIAS},version=v2,"
                                         "deprecated=2026-01-01,sunset=2027-06-30",
                              "--admin-api-key", ADMIN_KEY,
                              "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"])
    yield s
    s.stop()
    assert "panicked" not in s.stderr()
    s.remove_log()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://{server.http}/v1", api_key="unused", max_retries=0,
                         timeout=120)


def health(server, name: str) -> str:
    r = harness.buf_curl(server.grpc, "grpc.health.v1.Health/Check", {"service": name})
    return r.messages[0]["status"] if r.rc == 0 else r.error["code"]


def admin(server, method: str, body: dict) -> harness.BufResult:
    return harness.buf_curl(server.grpc, f"gyre.v1.Admin/{method}", body,
                            headers=[f"authorization: Bearer {ADMIN_KEY}"])


def st_encode(texts):
    from sentence_transformers import SentenceTransformer
    st = SentenceTransformer(str(harness.model_dir(EMBED)), device="cpu")
    return st.encode(texts, convert_to_numpy=True)


def test_both_models_are_listed(client, server):
    ids = [m.id for m in client.models.list().data]
    assert ids[0] == CHAT, ids
    assert EMBED in ids, ids
    grpc = harness.buf_curl(server.grpc, "gyre.v1.Generation/ListModels", {}).ok()
    by_id = {m["id"]: m for m in grpc.messages[0]["models"]}
    assert by_id[EMBED]["kind"] == "embed" and by_id[CHAT]["kind"] == "generate"
    assert by_id[EMBED]["aliases"] == [EMBED_ALIAS] and by_id[EMBED]["version"] == "v2"
    for name in (CHAT, EMBED, EMBED_ALIAS):
        assert health(server, name) == "SERVING", name


def test_embedding_alias_and_deprecation_notice(client):
    texts = ["alias routing", "reaches the pinned model"]
    r = client.embeddings.with_raw_response.create(model=EMBED_ALIAS, input=texts,
                                                    encoding_format="float")
    assert r.headers.get("deprecation") == "@1767225600", dict(r.headers)
    assert r.headers.get("sunset") == "Wed, 30 Jun 2027 00:00:00 GMT", dict(r.headers)
    out = r.parse()
    assert out.model == EMBED
    got = np.array([d.embedding for d in out.data])
    assert float(np.abs(got - st_encode(texts)).max()) <= 1e-5
    # The dynamo listing carries the same catalogue entry.
    import urllib.request
    with urllib.request.urlopen(f"http://{client.base_url.host}:{client.base_url.port}"
                                "/dynamo/alpha/list-models") as resp:
        listing = json.loads(resp.read())
    text = json.dumps(listing)
    assert EMBED in text and EMBED_ALIAS in text, listing


def test_admin_loads_and_unloads_an_embedding_model(server, client):
    loaded = admin(server, "LoadModel", {"source": str(harness.model_dir(EMBED)),
                                         "name": "minilm-2", "aliases": ["minilm-alias"]}).ok()
    model = loaded.messages[0]["model"]
    assert (model["id"], model["kind"]) == ("minilm-2", "embed"), model
    assert "minilm-2" in [m.id for m in client.models.list().data]
    assert health(server, "minilm-alias") == "SERVING"
    texts = ["loaded while serving"]
    out = client.embeddings.create(model="minilm-alias", input=texts, encoding_format="float")
    assert out.model == "minilm-2"
    assert float(np.abs(np.array([out.data[0].embedding]) - st_encode(texts)).max()) <= 1e-5
    stats = {m["model"]["id"]: m for m in admin(server, "ListModels", {}).ok().messages[0]["models"]}
    assert stats["minilm-2"]["source"].endswith(EMBED), stats["minilm-2"]
    result = admin(server, "UnloadModel", {"name": "minilm-2"}).ok().messages[0]
    assert result == {"id": "minilm-2", "drained": True}
    assert "minilm-2" not in [m.id for m in client.models.list().data]
    assert health(server, "minilm-2") == "not_found"
    with pytest.raises(openai.NotFoundError) as e:
        client.embeddings.create(model="minilm-alias", input="gone")
    assert e.value.code == "model_not_found"
    # The model given at start still serves.
    assert client.embeddings.create(model=EMBED, input="still here").model == EMBED


def test_chat_and_embeddings_from_one_server(client):
    refs = json.loads(harness.require_file(REFS, "the GGUF references (make models)").read_text())
    case = refs["transformers"]["cases"][0]
    r = client.chat.completions.create(model=CHAT, messages=case["messages"], temperature=0,
                                       max_tokens=48)
    assert r.choices[0].message.content == case["answer"]

    from sentence_transformers import SentenceTransformer
    texts = ["What is the capital of France?", "Paris is the capital of France."]
    st = SentenceTransformer(str(harness.model_dir(EMBED)), device="cpu")
    want = st.encode(texts, convert_to_numpy=True)
    got = np.array([d.embedding for d in
                    client.embeddings.create(model=EMBED, input=texts,
                                             encoding_format="float").data])
    assert got.shape == want.shape
    assert float(np.abs(got - want).max()) <= 1e-5


def test_each_model_refuses_the_other_route(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=CHAT, input="hello")
    assert e.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=EMBED, messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["param"] == "model"
