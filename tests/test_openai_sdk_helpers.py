"""The OpenAI Python SDK's helpers on top of chat completions, against
`gyre serve` on the real default model (SmolLM2-135M-Instruct).

- `client.chat.completions.stream(...)` (and `client.beta.chat.completions
  .stream`): the SDK's event stream (`content.delta`, `content.done`,
  `chunk`) over gyre's SSE, its accumulated final completion, and with a
  Pydantic `response_format` the parsed object in `content.done`;
- `client.chat.completions.parse(...)` (and `client.beta.chat.completions
  .parse`) with a Pydantic model as `response_format` (the SDK turns it into
  a strict JSON schema; gyre constrains decoding to it) and with
  `openai.pydantic_function_tool` tools (`parsed_arguments`).

Each helper's answer is checked against a plain `create` with the same
request body, so the helpers see exactly what gyre produces.
"""

from __future__ import annotations

import openai
import pydantic
import pytest

import harness

MODEL = "smollm2-135m-instruct"


class City(pydantic.BaseModel):
    name: str
    country: str


class GetWeather(pydantic.BaseModel):
    """Get the current weather in a city."""

    city: str
    unit: str


@pytest.fixture(scope="module")
def server():
    s = harness.Server.start([str(harness.GYRE_BIN), "serve",
                              "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"])
    yield s
    s.stop()
    assert "panicked" not in s.stderr()
    s.remove_log()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://{server.http}/v1", api_key="unused",
                         max_retries=0, timeout=120)


QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_stream_helper_events_join_to_the_whole_answer(client):
    whole = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0,
                                           max_tokens=40)
    for helper in (client.chat.completions, client.beta.chat.completions):
        deltas, snapshots, kinds = [], [], set()
        with helper.stream(model=MODEL, messages=QUESTION, temperature=0, max_tokens=40,
                           stream_options={"include_usage": True}) as stream:
            for event in stream:
                kinds.add(event.type)
                if event.type == "content.delta":
                    deltas.append(event.delta)
                    snapshots.append(event.snapshot)
                elif event.type == "content.done":
                    done = event.content
            final = stream.get_final_completion()
        assert {"chunk", "content.delta", "content.done"} <= kinds, kinds
        assert len(deltas) > 3, deltas
        text = "".join(deltas)
        assert text == whole.choices[0].message.content
        assert done == text and snapshots[-1] == text
        # Each snapshot extends the one before.
        assert all(b.startswith(a) for a, b in zip(snapshots, snapshots[1:]))
        assert final.choices[0].message.content == text
        assert final.choices[0].finish_reason == whole.choices[0].finish_reason
        assert final.usage.completion_tokens == whole.usage.completion_tokens
        assert final.usage.prompt_tokens == whole.usage.prompt_tokens


CITY_QUESTION = [{"role": "user",
                  "content": "Which city is the capital of France? Answer in JSON with name and country."}]


def test_parse_with_a_pydantic_model(client):
    for helper in (client.chat.completions, client.beta.chat.completions):
        r = helper.parse(model=MODEL, messages=CITY_QUESTION, response_format=City, temperature=0,
                         max_tokens=64)
        msg = r.choices[0].message
        assert r.choices[0].finish_reason == "stop", msg.content
        assert isinstance(msg.parsed, City), msg
        assert msg.parsed == City.model_validate_json(msg.content)
        assert msg.refusal is None
    # The same request as a plain body: the SDK's schema, gyre's answer.
    schema = openai.lib._pydantic.to_strict_json_schema(City)
    raw = client.chat.completions.create(
        model=MODEL, messages=CITY_QUESTION, temperature=0, max_tokens=64,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "City", "schema": schema, "strict": True}})
    assert raw.choices[0].message.content == msg.content


def test_stream_helper_parses_the_structured_answer(client):
    with client.chat.completions.stream(model=MODEL, messages=CITY_QUESTION, response_format=City,
                                        temperature=0, max_tokens=64) as stream:
        parsed = [e.parsed for e in stream if e.type == "content.done"]
        final = stream.get_final_completion()
    assert len(parsed) == 1 and isinstance(parsed[0], City), parsed
    assert final.choices[0].message.parsed == parsed[0]
    whole = client.chat.completions.parse(model=MODEL, messages=CITY_QUESTION, response_format=City,
                                          temperature=0, max_tokens=64)
    assert whole.choices[0].message.parsed == parsed[0]


def test_parse_with_a_pydantic_function_tool(client):
    tool = openai.pydantic_function_tool(GetWeather)
    messages = [{"role": "user", "content": "What's the weather in Paris, in celsius?"}]
    for helper in (client.chat.completions, client.beta.chat.completions):
        r = helper.parse(model=MODEL, messages=messages, tools=[tool], temperature=0,
                         max_tokens=80,
                         tool_choice={"type": "function", "function": {"name": "GetWeather"}})
        calls = r.choices[0].message.tool_calls
        assert calls and len(calls) == 1, r.choices[0].message
        call = calls[0]
        assert call.function.name == "GetWeather"
        assert isinstance(call.function.parsed_arguments, GetWeather), call
        assert call.function.parsed_arguments == GetWeather.model_validate_json(call.function.arguments)


def test_parse_refuses_a_truncated_answer_with_the_sdks_error(client):
    # Cut at 3 tokens the JSON is incomplete: gyre says `length`, and the SDK
    # raises its LengthFinishReasonError rather than parsing half an object.
    with pytest.raises(openai.LengthFinishReasonError):
        client.chat.completions.parse(model=MODEL, messages=CITY_QUESTION, response_format=City,
                                      temperature=0, max_tokens=3)
