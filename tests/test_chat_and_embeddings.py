"""One `gyre serve` with the real default chat model and the real
all-MiniLM-L6-v2 side by side (issue 13's "done when"): both listed by
`/v1/models`, chat answered as transformers answers on the default model,
embeddings equal to sentence-transformers', each through the official SDK,
and each model refusing the other's route with a 400 naming `model`.
"""

from __future__ import annotations

import json

import numpy as np
import openai
import pytest

import harness

CHAT = "smollm2-135m-instruct"
EMBED = "all-minilm-l6-v2"
REFS = harness.REPO / ".gyre" / "gguf-ref" / "manifest.json"


@pytest.fixture(scope="module")
def server():
    s = harness.Server.start([str(harness.GYRE_BIN), "serve",
                              "--model", str(harness.REPO / ".gyre" / "models" / f"{CHAT}.gguf"),
                              "--model", str(harness.model_dir(EMBED)),
                              "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"])
    yield s
    s.stop()
    assert "panicked" not in s.stderr()
    s.remove_log()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://{server.http}/v1", api_key="unused", max_retries=0,
                         timeout=120)


def test_both_models_are_listed(client):
    ids = [m.id for m in client.models.list().data]
    assert ids[0] == CHAT, ids
    assert EMBED in ids, ids


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
