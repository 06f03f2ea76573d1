"""Function calling and structured output through the Responses API.

The round trip the Responses API exists for runs on the real default model
(SmolLM2-135M-Instruct, served by a `gyre serve` with no `--model`, as in
test_default_model.py) through the official SDK: a call forced with
`tool_choice`, then its `function_call_output` sent with
`previous_response_id`, then a final answer, which must equal the answer
chat completions give for the same conversation (so the chain rebuilt the
call and its output in order). On tiny-qwen2 (random weights: constrained
decoding alone makes the calls valid) the streamed call's argument deltas
join to the final arguments, `text.format` JSON schemas are enforced, and a
reasoning section (DeepSeek-R1 template, steered as in test_reasoning.py)
becomes a `reasoning` item whose streamed deltas join to its text.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

import harness
import responses_util as ru
from conftest import QWEN

DEFAULT = "smollm2-135m-instruct"
WEATHER = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}, "days": {"type": "integer", "minimum": 1,
                                                                         "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather forecast", "parameters": WEATHER}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast",
                                                "parameters": WEATHER}}]
QUESTION = "What is the weather in Paris?"
FORECAST = json.dumps({"city": "Paris", "forecast": "sunny, 21 C"})


@pytest.fixture(scope="module")
def default_server():
    server = harness.Server.start([str(harness.GYRE_BIN), "serve",
                                   "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"])
    yield server
    server.stop()
    assert "panicked" not in server.stderr()
    server.remove_log()


@pytest.fixture(scope="module")
def default_client(default_server):
    return openai.OpenAI(base_url=f"http://{default_server.http}/v1", api_key="unused",
                         max_retries=0, timeout=120)


def test_function_call_round_trip_with_the_default_model(default_client):
    client = default_client
    first = client.responses.create(model=DEFAULT, input=QUESTION, tools=TOOLS, temperature=0,
                                    tool_choice={"type": "function", "name": "get_weather"},
                                    max_output_tokens=200)
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1, first.output
    call = calls[0]
    assert call.name == "get_weather" and call.call_id and call.id and call.id != call.call_id
    arguments = json.loads(call.arguments)
    jsonschema.validate(arguments, WEATHER)
    assert first.output_text == ""

    second = client.responses.create(
        model=DEFAULT, previous_response_id=first.id, tools=TOOLS, tool_choice="none", temperature=0,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": FORECAST}],
        max_output_tokens=48)
    assert second.previous_response_id == first.id
    assert [item.type for item in second.output] == ["message"]
    assert second.output_text
    assert second.usage.input_tokens > first.usage.input_tokens
    # Only this request's own input is its input items.
    items = client.responses.input_items.list(second.id)
    assert [(i.type, i.call_id) for i in items.data] == [("function_call_output", call.call_id)]

    # The chain is the conversation chat completions would see.
    chat = client.chat.completions.create(
        model=DEFAULT, temperature=0, max_tokens=48, tools=CHAT_TOOLS, tool_choice="none",
        messages=[
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call.call_id, "type": "function",
                 "function": {"name": call.name, "arguments": call.arguments}}]},
            {"role": "tool", "tool_call_id": call.call_id, "content": FORECAST},
        ])
    assert chat.choices[0].message.content == second.output_text
    assert chat.usage.prompt_tokens == second.usage.input_tokens


def test_forced_call_streams_its_arguments(qwen):
    body = {"model": QWEN, "input": QUESTION, "tools": TOOLS, "temperature": 0.8,
            "tool_choice": "required", "parallel_tool_calls": False, "max_output_tokens": 200}
    events = ru.stream(qwen.http, body)  # argument deltas join to each done
    final = events[-1]["response"]
    calls = [i for i in final["output"] if i["type"] == "function_call"]
    assert len(calls) == 1
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER)
    kinds = [e["type"] for e in events]
    assert "response.function_call_arguments.delta" in kinds
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert [d["name"] for d in done] == ["get_weather"]


@pytest.mark.parametrize("limit", [2, 3, 5, 8])
def test_a_forced_call_cut_off_is_never_text(qwen, client, limit):
    # Cut off by the token limit before its name is complete, a forced call's
    # syntax came back as text: a message reading '{"name": "'. Now the
    # output holds no message (at most the call, incomplete), in the
    # Responses API, streamed or not, and in chat completions.
    body = {"model": QWEN, "input": QUESTION, "tools": TOOLS, "tool_choice": "required", "temperature": 0,
            "max_output_tokens": limit}
    events = ru.stream(qwen.http, body)
    assert not [e for e in events if e["type"].startswith("response.output_text")], events
    for r in (ru.create(qwen.http, body), events[-1]["response"]):
        assert r["status"] == "incomplete", r
        assert [i["type"] for i in r["output"] if i["type"] != "function_call"] == [], r["output"]
        assert r.get("output_text", "") == "", r
    chat = client.chat.completions.create(model=QWEN, messages=[{"role": "user", "content": QUESTION}],
                                          tools=CHAT_TOOLS, tool_choice="required", temperature=0, max_tokens=limit)
    assert chat.choices[0].finish_reason == "length"
    assert not chat.choices[0].message.content, chat.choices[0].message


def test_json_schema_format_is_enforced(qwen):
    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}},
              "required": ["colour"], "additionalProperties": False}
    body = {"model": QWEN, "input": "Pick a colour.", "temperature": 0.8, "max_output_tokens": 60,
            "text": {"format": {"type": "json_schema", "name": "pick", "schema": schema, "strict": True}}}
    r = ru.create(qwen.http, body)
    assert r["text"]["format"]["type"] == "json_schema"
    assert r["text"]["format"]["schema"] == schema
    jsonschema.validate(json.loads(r["output_text"]), schema)


@pytest.fixture(scope="module")
def thinking(tmp_path_factory):
    """tiny-qwen2 with the DeepSeek-R1 distill template, whose generation
    prompt opens `<think>` (see test_reasoning.py)."""
    import shutil

    from test_reasoning import model_with_template
    d = model_with_template(tmp_path_factory.mktemp("responses-reasoning"), "deepseek-r1-distill-qwen-32b.jinja")
    server = harness.Server.start([str(harness.GYRE_BIN), "serve", "--model", str(d),
                                   "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"])
    yield server
    server.stop()
    shutil.rmtree(d.parent, ignore_errors=True)


def test_reasoning_becomes_a_reasoning_item(thinking):
    # Only the pieces of "</think>" can win, so some seed closes the section
    # and answers after it (test_reasoning.py's steering).
    end = [522, 26865, 29]
    base = {"model": QWEN, "input": "Think, then answer.", "max_output_tokens": 40, "temperature": 1.0,
            "logit_bias": {str(t): 100 for t in end}}
    for seed in range(30):
        r = ru.create(thinking.http, {**base, "seed": seed})
        if [i["type"] for i in r["output"]] == ["reasoning", "message"] and r["output_text"]:
            break
    else:
        pytest.fail("no seed closed the reasoning section")
    reasoning = r["output"][0]
    assert reasoning["content"][0]["type"] == "reasoning_text" and reasoning["content"][0]["text"]
    assert "</think>" not in reasoning["content"][0]["text"]
    assert 0 < r["usage"]["output_tokens_details"]["reasoning_tokens"] < r["usage"]["output_tokens"]
    # The same seed streamed: reasoning deltas join to the item's text.
    events = ru.stream(thinking.http, {**base, "seed": seed})
    kinds = [e["type"] for e in events]
    assert "response.reasoning_text.delta" in kinds and "response.reasoning_text.done" in kinds
    assert events[-1]["response"]["output"][0]["content"] == reasoning["content"]
    assert events[-1]["response"]["output_text"] == r["output_text"]
