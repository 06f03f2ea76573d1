"""Structured outputs enforced by constrained decoding (llguidance token
masks applied before sampling), through the official OpenAI SDK and gRPC.

The model has random weights, so nothing but the constraint makes its output
valid: every sample must still parse and validate, and must end by itself
(finish_reason "stop") well before max_tokens.
"""

import json
import re

import jsonschema
import openai
import pytest

import harness
import openai_schema

MODEL = "tiny-qwen2"
MESSAGES = [{"role": "user", "content": "Describe an order."}]

NESTED = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 9999},
        "status": {"enum": ["new", "paid", "shipped"]},
        "express": {"type": "boolean"},
        "note": {"type": "string", "maxLength": 12},
        "items": {
            "type": "array",
            "minItems": 1,
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"enum": ["A1", "B2", "C3"]},
                    "qty": {"type": "integer", "minimum": 1, "maximum": 20},
                },
                "required": ["sku", "qty"],
                "additionalProperties": False,
            },
        },
        "address": {
            "type": "object",
            "properties": {"zone": {"type": "integer", "minimum": -5, "maximum": 5}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
    "required": ["id", "status", "items", "address"],
    "additionalProperties": False,
}


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "order", "schema": schema, "strict": True}}


def test_hundred_random_samples_all_validate(client):
    """The issue's proof: temperature 1.0, 100 samples, a nested schema."""
    contents = []
    for seed in range(5):
        reply = client.chat.completions.create(
            model=MODEL, messages=MESSAGES, n=20, temperature=1.0, seed=seed, max_tokens=400,
            response_format=schema_format(NESTED),
        )
        openai_schema.validate("CreateChatCompletionResponse", reply.model_dump(exclude_unset=True))
        for choice in reply.choices:
            assert choice.finish_reason == "stop", choice
            contents.append(choice.message.content)
    assert len(contents) == 100
    for text in contents:
        jsonschema.validate(json.loads(text), NESTED)
    # Sampling is real: the samples are not all the same.
    assert len(set(contents)) > 10


def test_streamed_schema_and_json_object(client):
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature=1.0, seed=3, max_tokens=400, stream=True,
        response_format=schema_format(NESTED),
    )
    text, finish = "", None
    for chunk in stream:
        openai_schema.validate("CreateChatCompletionStreamResponse", chunk.model_dump(exclude_unset=True))
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert finish == "stop"
    jsonschema.validate(json.loads(text), NESTED)


def test_json_object_ends_once_complete(client, tokenize):
    """Any JSON object: a random model's free-form keys can run on for ever,
    so the closing tokens are favoured with logit_bias. Unconstrained, that
    bias repeats braces until max_tokens; under json_object the object is
    complete after the first one and only EOS is allowed."""
    bias = {str(t): 30 for s in ("{}", "}") for t in tokenize(text=s)}
    args = dict(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=20, logit_bias=bias)
    free = client.chat.completions.create(**args).choices[0]
    # Unconstrained: the favoured braces repeat, not one JSON object.
    assert free.finish_reason == "length" and free.message.content.count("}") > 3, free
    bound = client.chat.completions.create(**args, response_format={"type": "json_object"}).choices[0]
    assert bound.finish_reason == "stop", bound
    assert json.loads(bound.message.content) == {}


def test_stream_and_non_stream_agree(client):
    args = dict(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=300, response_format=schema_format(NESTED))
    whole = client.chat.completions.create(**args).choices[0].message.content
    parts = client.chat.completions.create(**args, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
    assert streamed == whole
    jsonschema.validate(json.loads(whole), NESTED)


@pytest.mark.parametrize(
    "extra, check",
    [
        ({"guided_regex": r"[0-9]{3}-[a-z]{2}"}, lambda t: re.fullmatch(r"[0-9]{3}-[a-z]{2}", t)),
        ({"structured_outputs": {"regex": r"(yes|no), [A-Z][a-z]{1,5}\."}},
         lambda t: re.fullmatch(r"(yes|no), [A-Z][a-z]{1,5}\.", t)),
        ({"guided_choice": ["red", "green", "blue sky"]}, lambda t: t in ("red", "green", "blue sky")),
        ({"structured_outputs": {"grammar": 'start: ("ab" | "c")+ "!"'}},
         lambda t: re.fullmatch(r"(ab|c)+!", t)),
        ({"guided_json": {"type": "array", "items": {"type": "integer"}, "maxItems": 4}},
         lambda t: isinstance(json.loads(t), list) and len(json.loads(t)) <= 4),
    ],
)
def test_completions_extensions(client, extra, check):
    reply = client.completions.create(model=MODEL, prompt="Answer:", n=10, temperature=1.0, seed=1,
                                      max_tokens=100, extra_body=extra)
    for choice in reply.choices:
        assert choice.finish_reason == "stop", choice
        assert check(choice.text), (extra, choice.text)


def test_grpc_typed_choice(qwen):
    req = {"text": "Pick:", "maxTokens": 20, "sampling": {"temperature": 1.0, "seed": 5},
           "structured": {"choice": {"options": ["alpha", "beta"]}}}
    events = harness.buf_curl(qwen.grpc, "gyre.v1.Generation/GenerateStream", req).ok().messages
    text = "".join(e["delta"].get("text", "") for e in events if "delta" in e)
    assert text in ("alpha", "beta"), events
    assert events[-1]["finish"]["reason"] == "FINISH_REASON_STOP", events[-1]


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
         "response_format"),
        ("/v1/chat/completions", {"response_format": {"type": "yaml"}}, "response_format"),
        ("/v1/chat/completions", {"response_format": schema_format({"type": "nonsense"})}, "response_format"),
        ("/v1/chat/completions", {"response_format": {"type": "json_object"}, "guided_regex": "a+"}, "response_format"),
        ("/v1/completions", {"guided_json": "{not json"}, "structured_outputs"),
        ("/v1/completions", {"guided_regex": "a+", "guided_choice": ["a"]}, "guided_choice"),
        ("/v1/completions", {"guided_choice": []}, "structured_outputs"),
        ("/v1/completions", {"structured_outputs": {"grammar": "start: nonexistent_rule"}}, "structured_outputs"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_bad_structures_are_400(qwen, path, body, param, stream):
    base = {"model": MODEL, "max_tokens": 5, "stream": stream}
    base.update({"messages": MESSAGES} if "chat" in path else {"prompt": "x"})
    reply = harness.http_json(qwen.http, path, {**base, **body})
    assert reply.status == 400, reply.body
    openai_schema.validate("ErrorResponse", reply.json())
    assert reply.json()["error"]["param"] == param, reply.body
    assert not reply.body.startswith(b"data:")


def test_sdk_raises_bad_request(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5,
                                       response_format=schema_format({"type": "object", "minProperties": "x"}))
    assert e.value.body["param"] == "response_format"
