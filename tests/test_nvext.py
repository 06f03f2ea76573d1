"""The `nvext` request extension (NVIDIA Dynamo's), sent as users do through
the OpenAI SDK's `extra_body`: ignore_eos, top_k, repetition_penalty,
greedy_sampling (and Dynamo's spelling greed_sampling), use_raw_prompt, and
annotations returned as named SSE events that the SDK still parses. A field
given both in nvext and at the top level must agree (else 400 naming
`nvext.<field>`)."""

import json

import openai
import pytest

import harness
import openai_schema as spec

MODEL = "tiny-qwen2"
EOS = 151645  # <|im_end|>, the tiny Qwen2's EOS
MESSAGES = [{"role": "user", "content": "Once upon a time"}]


def text_of(client, **kw) -> tuple[str, object]:
    out = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, **kw)
    return out.choices[0].text, out


def test_ignore_eos_through_nvext(client):
    # EOS forced by logit_bias: the request stops after one token...
    _, stopped = text_of(client, logit_bias={str(EOS): 100})
    assert stopped.choices[0].finish_reason == "stop" and stopped.usage.completion_tokens == 1
    # ...unless nvext.ignore_eos lets it run to max_tokens.
    _, kept = text_of(client, logit_bias={str(EOS): 100}, extra_body={"nvext": {"ignore_eos": True}})
    assert kept.choices[0].finish_reason == "length" and kept.usage.completion_tokens == 8


def test_greedy_sampling_top_k_and_repetition_penalty(client):
    greedy, _ = text_of(client, temperature=0)
    for nvext in ({"greedy_sampling": True}, {"greed_sampling": True}):
        assert text_of(client, extra_body={"nvext": nvext})[0] == greedy, nvext
    # top_k 1 at temperature 1 is greedy too.
    assert text_of(client, temperature=1.0, seed=5, extra_body={"nvext": {"top_k": 1}})[0] == greedy
    penalised, _ = text_of(client, temperature=0, extra_body={"repetition_penalty": 1.8})
    assert text_of(client, temperature=0, extra_body={"nvext": {"repetition_penalty": 1.8}})[0] == penalised
    # The same value at both levels is fine.
    assert text_of(client, temperature=0, extra_body={"top_k": 3, "nvext": {"top_k": 3}})[0] == greedy


@pytest.mark.parametrize("body,param", [
    ({"top_k": 5, "nvext": {"top_k": 6}}, "nvext.top_k"),
    ({"ignore_eos": False, "nvext": {"ignore_eos": True}}, "nvext.ignore_eos"),
    ({"repetition_penalty": 1.1, "nvext": {"repetition_penalty": 1.2}}, "nvext.repetition_penalty"),
    ({"temperature": 0.8, "nvext": {"greedy_sampling": True}}, "nvext.greedy_sampling"),
    ({"nvext": {"top_k": "many"}}, "nvext.top_k"),
    ({"nvext": {"annotations": "token_ids"}}, "nvext.annotations"),
    ({"nvext": {"repetition_penalty": 0}}, "repetition_penalty"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_conflicts_and_bad_values_are_400(qwen, body, param, stream):
    payload = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2, "stream": stream, **body}
    reply = harness.http_json(qwen.http, "/v1/chat/completions", payload)
    assert reply.status == 400, reply.body
    assert b"data:" not in reply.body
    err = reply.json()
    spec.validate(spec.ERROR, err)
    assert err["error"]["param"] == param, err


def test_use_raw_prompt_skips_the_chat_template(client):
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "system", "content": "ignored"},
                                                                 *MESSAGES], max_tokens=8, temperature=0,
                                          extra_body={"nvext": {"use_raw_prompt": True}})
    plain, completion = text_of(client, temperature=0)
    assert chat.choices[0].message.content == plain
    assert chat.usage.prompt_tokens == completion.usage.prompt_tokens
    templated = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0)
    assert templated.usage.prompt_tokens > chat.usage.prompt_tokens


def sse_events(raw: bytes) -> list[tuple[str | None, str]]:
    """(event name or None, data) of each SSE event."""
    out, name, data = [], None, []
    for line in raw.decode().splitlines():
        if line == "":
            if data:
                out.append((name, "\n".join(data)))
            name, data = None, []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    return out


def test_annotations_are_named_sse_events(qwen):
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True},
            "nvext": {"annotations": ["formatted_prompt", "token_ids", "no_such_annotation"]}}
    reply = harness.http_request(qwen.http, "POST", "/v1/chat/completions", json.dumps(body))
    assert reply.status == 200, reply.body
    events = sse_events(reply.body)
    named = {name: json.loads(data) for name, data in events if name}
    assert set(named) == {"formatted_prompt", "token_ids"}, "unknown names are ignored"
    rendered = harness.buf_curl(qwen.grpc, "gyre.v1.Generation/Tokenize",
                                {"model": MODEL, "chat": {"messages": MESSAGES}}).ok().messages[0]
    assert named["formatted_prompt"]["nvext"]["value"] == rendered["prompt"]
    assert named["token_ids"]["nvext"]["value"] == [int(t) for t in rendered["tokenIds"]]
    for name, chunk in named.items():
        assert chunk["choices"] == [] and chunk["nvext"]["annotation"] == name and chunk["nvext"]["index"] == 0
    for _, data in events[:-1]:
        spec.validate(spec.CHAT_CHUNK, json.loads(data))
    # The annotations come before any content.
    first_content = next(i for i, (n, d) in enumerate(events)
                         if not n and d != "[DONE]" and any(c["delta"].get("content") for c in json.loads(d)["choices"]))
    assert all(i < first_content for i, (n, _) in enumerate(events) if n)
    assert events[-1] == (None, "[DONE]")


def test_the_sdk_streams_through_annotations(client):
    base = dict(model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0)
    plain = client.chat.completions.create(**base).choices[0].message.content
    chunks = list(client.chat.completions.create(
        **base, stream=True, extra_body={"nvext": {"annotations": ["token_ids"]}}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain
    annotated = [c for c in chunks if not c.choices and (c.model_extra or {}).get("nvext")]
    assert len(annotated) == 1 and annotated[0].model_extra["nvext"]["annotation"] == "token_ids"
    # Without streaming, annotations are ignored.
    whole = client.chat.completions.create(**base, extra_body={"nvext": {"annotations": ["token_ids"]}})
    assert whole.choices[0].message.content == plain


def test_completion_annotations_once_per_prompt(qwen):
    body = {"model": MODEL, "prompt": ["Once upon a time", "Hello"], "n": 2, "max_tokens": 2, "stream": True,
            "nvext": {"annotations": ["formatted_prompt"]}}
    reply = harness.http_request(qwen.http, "POST", "/v1/completions", json.dumps(body))
    assert reply.status == 200, reply.body
    events = [(n, json.loads(d)) for n, d in sse_events(reply.body) if d != "[DONE]"]
    named = {d["nvext"]["index"]: d["nvext"]["value"] for n, d in events if n == "formatted_prompt"}
    assert named == {0: "Once upon a time", 2: "Hello"}
    for _, d in events:
        spec.validate(spec.COMPLETION_CHUNK, d)
    # No echo was asked for: no choice's text starts with its prompt chunk.
    texts = [c["text"] for _, d in events for c in d["choices"]]
    assert "Once upon a time" not in texts and "Hello" not in texts


def test_nvext_with_the_sdk_chat_errors(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, temperature=0.5,
                                       extra_body={"nvext": {"greedy_sampling": True}})
    assert err.value.body["param"] == "nvext.greedy_sampling"
