"""`--kv-cache-dtype`: a float16 KV cache on the CPU.

The real default model (SmolLM2-135M-Instruct, its Q4_1 GGUF) is served with
`--kv-cache-dtype f16` and with the default, each with a 64 MiB cache:
- the float16 cache holds twice the blocks in the same memory (`GetStats`);
- with it, the greedy answer to the France question still equals what
  transformers generates from the same GGUF (the numerics against
  transformers, logits and all four reference continuations, are in
  `engine/tests/gguf.rs`).

A value that is not a dtype is refused with an error that lists them.
"""

from __future__ import annotations

import json
import subprocess

import harness

GGUF = "smollm2-135m-instruct.gguf"
REFS = harness.REPO / ".gyre" / "gguf-ref" / "manifest.json"


def served(start, *args: str) -> tuple[int, str]:
    """KV blocks of a server started (by the `module_server` factory) with
    a 64 MiB cache and `args`, and its greedy answer to the France
    question."""
    case = json.loads(harness.require_file(REFS, "the GGUF references (make models)").read_text())
    case = case["transformers"]["cases"][0]
    server = start(GGUF, "--kv-cache-mib", "64", *args)
    [s] = harness.buf_curl(server.grpc, "gyre.v1.Generation/GetStats", {}).ok().messages
    model = harness.http_json(server.http, "/v1/models").json()["data"][0]["id"]
    chat = harness.http_json(server.http, "/v1/chat/completions", {
        "model": model, "temperature": 0, "max_tokens": 48, "messages": case["messages"]})
    assert chat.status == 200, chat.body
    answer = chat.json()["choices"][0]["message"]["content"]
    assert answer == case["answer"], (args, answer, case["answer"])
    return int(s["kvBlocksTotal"]), answer


def test_a_float16_cache_holds_twice_the_tokens_and_answers_alike(module_server):
    full, answer = served(module_server)
    half, answer_f16 = served(module_server, "--kv-cache-dtype", "f16")
    assert full > 0 and half == 2 * full, (full, half)
    assert "Paris" in answer_f16 and answer_f16 == answer


def test_an_unknown_dtype_is_refused():
    r = subprocess.run([str(harness.GYRE_BIN), "serve", "--kv-cache-dtype", "int4"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "int4" in r.stderr and "f16" in r.stderr, r.stderr
