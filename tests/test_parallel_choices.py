"""n > 1 through the OpenAI API: one choice per index, each finishing once,
stream and non-stream identical for a fixed seed, usage counting the prompt
once and every choice's tokens; every body and chunk valid against the
official spec."""

import openai
import pytest

import harness
import openai_schema as spec

MODEL = "tiny-qwen2"
N, MAX = 3, 6


def chat_body(**extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story"}],
            "max_tokens": MAX, "temperature": 1.0, "seed": 11, "n": N, **extra}


def test_chat_choices_stream_equals_non_stream(qwen):
    whole = harness.http_json(qwen.http, "/v1/chat/completions", chat_body())
    assert whole.status == 200, whole.body
    body = whole.json()
    spec.validate(spec.CHAT, body)
    assert [c["index"] for c in body["choices"]] == list(range(N))
    assert all(c["finish_reason"] == "length" for c in body["choices"])
    texts = [c["message"]["content"] for c in body["choices"]]
    assert len(set(texts)) > 1, "seeded choices should differ"
    single = harness.http_json(qwen.http, "/v1/chat/completions", chat_body(n=1)).json()
    assert body["usage"]["prompt_tokens"] == single["usage"]["prompt_tokens"], "the prompt counts once"
    assert body["usage"]["completion_tokens"] == N * MAX
    again = harness.http_json(qwen.http, "/v1/chat/completions", chat_body()).json()
    assert [c["message"]["content"] for c in again["choices"]] == texts, "same seed, same choices"

    sse = harness.http_sse(qwen.http, "/v1/chat/completions",
                           chat_body(stream=True, stream_options={"include_usage": True}))
    assert sse.status == 200 and sse.done
    chunks = sse.chunks()
    for c in chunks:
        spec.validate(spec.CHAT_CHUNK, c)
    streamed = {i: "" for i in range(N)}
    roles, finishes = [], []
    for c in chunks[:-1]:
        [choice] = c["choices"]
        i = choice["index"]
        if choice["delta"].get("role"):
            roles.append(i)
        streamed[i] += choice["delta"].get("content") or ""
        if choice["finish_reason"]:
            finishes.append(i)
    assert sorted(roles) == list(range(N)) and sorted(finishes) == list(range(N))
    assert [streamed[i] for i in range(N)] == texts
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == N * MAX


def test_completion_choices(client):
    args = dict(model=MODEL, prompt="Once upon a time", max_tokens=MAX, temperature=1.0, seed=3, n=2)
    whole = client.completions.create(**args)
    assert [c.index for c in whole.choices] == [0, 1]
    assert whole.usage.completion_tokens == 2 * MAX
    parts = {0: "", 1: ""}
    finished = []
    for chunk in client.completions.create(**args, stream=True):
        for c in chunk.choices:
            parts[c.index] += c.text
            if c.finish_reason:
                finished.append(c.index)
    assert sorted(finished) == [0, 1]
    assert [parts[0], parts[1]] == [c.text for c in whole.choices]


@pytest.mark.parametrize("n", [0, 129])
def test_n_out_of_range(client, n):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=2, n=n)
    assert err.value.body["param"] == "n"


def test_prompt_batches_give_choices_per_prompt(qwen):
    prompts = ["Once upon a time", "Hello there"]
    base = {"model": MODEL, "max_tokens": MAX, "temperature": 0, "ignore_eos": True}
    singles = [harness.http_json(qwen.http, "/v1/completions", {**base, "prompt": p}).json() for p in prompts]
    reply = harness.http_json(qwen.http, "/v1/completions", {**base, "prompt": prompts, "n": 2})
    assert reply.status == 200, reply.body
    out = reply.json()
    spec.validate(spec.COMPLETION, out)
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    want = [s["choices"][0]["text"] for s in singles]
    assert [c["text"] for c in out["choices"]] == [want[0], want[0], want[1], want[1]]
    assert out["usage"]["prompt_tokens"] == sum(s["usage"]["prompt_tokens"] for s in singles)
    assert out["usage"]["completion_tokens"] == 4 * MAX
    sse = harness.http_sse(qwen.http, "/v1/completions", {**base, "prompt": prompts, "n": 2, "stream": True})
    assert sse.status == 200 and sse.done
    texts, finished = {i: "" for i in range(4)}, []
    for chunk in sse.chunks():
        spec.validate(spec.COMPLETION_CHUNK, chunk)
        for c in chunk["choices"]:
            texts[c["index"]] += c["text"]
            if c["finish_reason"]:
                finished.append(c["index"])
    assert sorted(finished) == [0, 1, 2, 3]
    assert [texts[i] for i in range(4)] == [c["text"] for c in out["choices"]]
    ids = harness.http_json(qwen.http, "/v1/completions", {**base, "prompt": [[9707, 11], [1879]]})
    assert ids.status == 200 and len(ids.json()["choices"]) == 2
