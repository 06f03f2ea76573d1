"""The official `openai` Python SDK against `gyre serve` (tiny-qwen2).

Covers what an OpenAI client relies on: models list/retrieve, chat and legacy
completions (whole and streamed), usage accounting (prompt tokens checked
against the gRPC `Tokenize` of the same input), streaming framing (role first,
one finishing chunk, the include_usage chunk), greedy determinism across
stream/non-stream, seeded sampling, stop strings, the SDK's typed errors and
API-key authentication. Wire-format conformance to the OpenAI spec is checked
separately (test_openai_schema.py), on raw HTTP.
"""

from __future__ import annotations

import openai
import pytest

from conftest import API_KEY, QWEN

MESSAGES = [{"role": "user", "content": "Write one sentence about the sea."}]
PROMPT = "The capital of France is"


def chat(client, stream: bool, **kw):
    kw.setdefault("messages", MESSAGES)
    return client.chat.completions.create(model=QWEN, stream=stream, **kw)


def complete(client, stream: bool, **kw):
    kw.setdefault("prompt", PROMPT)
    return client.completions.create(model=QWEN, stream=stream, **kw)


def chat_stream(client, **kw) -> tuple[str, str | None, list]:
    """(content, finish_reason, chunks) of a streamed chat completion."""
    chunks = list(chat(client, True, **kw))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(reasons) == 1, f"expected exactly one chunk with a finish_reason, got {reasons}"
    return content, reasons[0], chunks


def completion_stream(client, **kw) -> tuple[str, str | None, list]:
    """(text, finish_reason, chunks) of a streamed legacy completion."""
    chunks = list(complete(client, True, **kw))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(reasons) == 1, f"expected exactly one chunk with a finish_reason, got {reasons}"
    return text, reasons[0], chunks


# --- models ---------------------------------------------------------------


def test_models_list_and_retrieve(client):
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert QWEN in ids, ids
    model = client.models.retrieve(QWEN)
    assert (model.id, model.object) == (QWEN, "model")
    assert model.owned_by and isinstance(model.created, int) and model.created > 0


def test_models_retrieve_unknown_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as exc:
        client.models.retrieve("nope")
    assert exc.value.status_code == 404


# --- chat completions -----------------------------------------------------


def test_chat_non_stream(client, tokenize):
    r = chat(client, False, max_tokens=8, temperature=0)
    assert r.object == "chat.completion"
    assert r.model == QWEN and r.id and r.created > 0
    assert len(r.choices) == 1
    choice = r.choices[0]
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason == "length"
    assert r.usage.completion_tokens == 8
    assert r.usage.prompt_tokens == len(tokenize(messages=MESSAGES))
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_stream_framing_and_usage(client, tokenize):
    content, reason, chunks = chat_stream(client, max_tokens=8, temperature=0,
                                          stream_options={"include_usage": True})
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1, "every chunk carries the same id"
    assert all(c.model == QWEN for c in chunks)
    first = chunks[0]
    assert first.choices and first.choices[0].delta.role == "assistant", first
    assert reason == "length"
    assert content
    *body, last = chunks
    assert last.choices == [], "the include_usage chunk has no choices"
    assert last.usage is not None
    assert last.usage.completion_tokens == 8
    assert last.usage.prompt_tokens == len(tokenize(messages=MESSAGES))
    assert last.usage.total_tokens == last.usage.prompt_tokens + 8
    assert all(c.usage is None for c in body), "only the last chunk carries usage"
    assert body[-1].choices[0].finish_reason == "length", "the finishing chunk comes right before usage"


def test_chat_stream_without_include_usage(client):
    _, reason, chunks = chat_stream(client, max_tokens=4, temperature=0)
    assert reason == "length"
    assert all(c.choices for c in chunks), "no usage-only chunk unless include_usage"
    assert all(c.usage is None for c in chunks)


# --- legacy completions ---------------------------------------------------


def test_completion_non_stream(client, tokenize):
    r = complete(client, False, max_tokens=6, temperature=0)
    assert r.object == "text_completion"
    assert r.model == QWEN and r.id
    assert len(r.choices) == 1 and r.choices[0].index == 0
    assert isinstance(r.choices[0].text, str) and r.choices[0].text
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 6
    assert r.usage.prompt_tokens == len(tokenize(text=PROMPT))
    assert r.usage.total_tokens == r.usage.prompt_tokens + 6


def test_completion_stream_framing_and_usage(client, tokenize):
    text, reason, chunks = completion_stream(client, max_tokens=6, temperature=0,
                                             stream_options={"include_usage": True})
    assert all(c.object == "text_completion" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert reason == "length" and text
    *body, last = chunks
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 6
    assert last.usage.prompt_tokens == len(tokenize(text=PROMPT))
    assert all(c.usage is None for c in body)


def test_completion_token_id_prompt(client, tokenize):
    ids = tokenize(text=PROMPT)
    by_ids = complete(client, False, prompt=ids, max_tokens=6, temperature=0)
    by_text = complete(client, False, max_tokens=6, temperature=0)
    assert by_ids.usage.prompt_tokens == len(ids)
    assert by_ids.choices[0].text == by_text.choices[0].text


# --- determinism ----------------------------------------------------------


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_greedy_stream_equals_non_stream(client, endpoint):
    if endpoint == "chat":
        whole = chat(client, False, max_tokens=24, temperature=0)
        content, reason, _ = chat_stream(client, max_tokens=24, temperature=0)
        assert (content, reason) == (whole.choices[0].message.content, whole.choices[0].finish_reason)
    else:
        whole = complete(client, False, max_tokens=24, temperature=0)
        text, reason, _ = completion_stream(client, max_tokens=24, temperature=0)
        assert (text, reason) == (whole.choices[0].text, whole.choices[0].finish_reason)


def test_seed_reproducible(client):
    def sample(seed: int) -> str:
        r = complete(client, False, max_tokens=16, temperature=1.0, seed=seed)
        return r.choices[0].text

    first, again = sample(1234), sample(1234)
    assert first == again, "the same seed must give the same text"
    others = [sample(s) for s in (1, 2, 3)]
    assert any(o != first for o in others), f"three other seeds all gave {first!r}"


# --- stop strings ---------------------------------------------------------


def pick_stop(text: str) -> tuple[str, str]:
    """A stop string from the middle of `text` and the text expected before it."""
    for start in range(len(text) // 2, len(text) - 3):
        stop = text[start:start + 3]
        if stop.strip() and "\ufffd" not in stop:
            return stop, text[: text.index(stop)]
    pytest.fail(f"no usable stop string in {text!r}")


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_stop_string(client, endpoint):
    params = dict(max_tokens=32, temperature=0)
    if endpoint == "chat":
        full = chat(client, False, **params).choices[0].message.content
    else:
        full = complete(client, False, **params).choices[0].text
    stop, expected = pick_stop(full)

    if endpoint == "chat":
        whole = chat(client, False, stop=[stop], **params).choices[0]
        got, reason = whole.message.content, whole.finish_reason
        streamed, s_reason, chunks = chat_stream(client, stop=[stop], **params)
        pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    else:
        whole = complete(client, False, stop=stop, **params).choices[0]
        got, reason = whole.text, whole.finish_reason
        streamed, s_reason, chunks = completion_stream(client, stop=stop, **params)
        pieces = [c.choices[0].text for c in chunks if c.choices]

    assert (got, reason) == (expected, "stop"), f"stop={stop!r} full={full!r}"
    assert (streamed, s_reason) == (expected, "stop")
    assert not any(stop in p for p in pieces), f"stop string {stop!r} leaked into {pieces}"


# --- errors and authentication --------------------------------------------


def test_sdk_bad_request_for_out_of_range_temperature(client):
    with pytest.raises(openai.BadRequestError) as exc:
        chat(client, False, max_tokens=4, temperature=5)
    assert exc.value.status_code == 400
    assert exc.value.param == "temperature"


def test_sdk_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="nope", messages=MESSAGES, max_tokens=4)
    assert exc.value.code == "model_not_found"


def test_api_key(keyed):
    base = f"http://{keyed.http}/v1"
    wrong = openai.OpenAI(base_url=base, api_key="wrong", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError) as exc:
        wrong.models.list()
    assert exc.value.status_code == 401
    with pytest.raises(openai.AuthenticationError):
        wrong.completions.create(model=QWEN, prompt=PROMPT, max_tokens=2)

    right = openai.OpenAI(base_url=base, api_key=API_KEY, max_retries=0, timeout=60)
    assert QWEN in [m.id for m in right.models.list().data]
    r = right.completions.create(model=QWEN, prompt=PROMPT, max_tokens=3, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
