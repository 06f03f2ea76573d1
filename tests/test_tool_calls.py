"""Tool calling through the official OpenAI SDK and gRPC.

tiny-qwen2's template asks for Hermes-style calls (`<tool_call>{json}
</tool_call>`). Its weights are random, so `required` and named tool_choice
must hold by constrained decoding alone: every sample is a call to an
allowed tool with arguments valid against that tool's schema. Calls are
parsed out of the text (no markup reaches `content`), get unique ids, and the
choice finishes with `tool_calls`.
"""

import json
import re

import jsonschema
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

import harness
import openai_schema

MODEL = "tiny-qwen2"
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Oslo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "units": {"enum": ["C", "F"]},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ID = re.compile(r"[A-Za-z0-9]{9,}")


def check_calls(calls, allowed=("get_weather", "get_time")):
    assert calls, "no tool calls"
    for c in calls:
        assert c.type == "function"
        assert ID.fullmatch(c.id), c.id
        assert c.function.name in allowed, c.function.name
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


def test_required_calls_are_valid_under_random_sampling(client):
    ids = []
    for seed, parallel in ((1, False), (2, False), (3, True)):
        reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                               parallel_tool_calls=parallel, n=10, temperature=1.0, seed=seed,
                                               max_tokens=300)
        openai_schema.validate("CreateChatCompletionResponse", reply.model_dump(exclude_unset=True))
        for choice in reply.choices:
            check_calls(choice.message.tool_calls)
            ids += [c.id for c in choice.message.tool_calls]
            if parallel:
                # A random model may go on calling until max_tokens; every
                # call it finished is still valid.
                assert choice.finish_reason in ("tool_calls", "length"), choice
            else:
                assert choice.finish_reason == "tool_calls", choice
                assert choice.message.content is None, choice.message
                assert len(choice.message.tool_calls) == 1
    assert len(ids) == len(set(ids)), "tool call ids repeat"


def test_named_function_and_no_parallel_calls(client):
    reply = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS, n=8, temperature=1.0, seed=7, max_tokens=300,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, parallel_tool_calls=False,
    )
    for choice in reply.choices:
        assert choice.finish_reason == "tool_calls"
        assert len(choice.message.tool_calls) == 1, choice.message.tool_calls
        check_calls(choice.message.tool_calls, allowed=("get_weather",))


@pytest.mark.parametrize("parameters", [
    {},
    {"properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"], "additionalProperties": False},
], ids=["empty", "untyped"])
def test_a_schema_without_a_type_still_forces_an_object_call(client, parameters):
    # Without a `type`, a schema lets the forced arguments be any JSON value;
    # a string or a number there is no call to the parser, and the reply
    # came back as text (finish_reason "stop").
    tools = [{"type": "function", "function": {"name": "f", "parameters": parameters}}]
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=tools, tool_choice="required",
                                           parallel_tool_calls=False, n=8, temperature=1.0, seed=5, max_tokens=200)
    for choice in reply.choices:
        assert choice.message.content is None, choice
        (call,) = choice.message.tool_calls
        assert call.function.name == "f"
        if parameters or choice.finish_reason != "length":
            # A random model may fill an open object until max_tokens.
            assert choice.finish_reason == "tool_calls", choice
            args = json.loads(call.function.arguments)
            assert isinstance(args, dict), args
            jsonschema.validate(args, {"type": "object", **parameters})


def test_stream_deltas_match_the_non_streamed_calls(client):
    args = dict(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=300)
    whole = client.chat.completions.create(**args).choices[0]
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(**args, stream=True):
        openai_schema.validate("CreateChatCompletionStreamResponse", chunk.model_dump(exclude_unset=True))
        for c in chunk.choices:
            assert not c.delta.content, c.delta  # no markup, no text
            for d in c.delta.tool_calls or []:
                if d.index not in calls:
                    # The first fragment of a call carries id, type and name.
                    assert d.id and d.type == "function" and d.function.name, d
                    calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
                calls[d.index]["arguments"] += d.function.arguments or ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls"
    streamed = [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)]
    assert streamed == [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert list(calls) == list(range(len(calls)))


def test_arguments_stream_in_fragments_the_sdk_accumulates(client):
    """Hermes calls stream their arguments as they are generated: a call's first fragment carries id, type and
    name, later ones only argument text, and the SDK's own stream accumulation rebuilds exactly the calls of the
    same request not streamed."""
    args = dict(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required", parallel_tool_calls=True,
                temperature=0, max_tokens=300)
    whole = client.chat.completions.create(**args).choices[0].message.tool_calls
    state = ChatCompletionStreamState()
    fragments: dict[int, list] = {}
    sdk_deltas: dict[int, str] = {}
    for chunk in client.chat.completions.create(**args, stream=True):
        for event in state.handle_chunk(chunk):
            if event.type == "tool_calls.function.arguments.delta":
                sdk_deltas[event.index] = sdk_deltas.get(event.index, "") + event.arguments_delta
        for c in chunk.choices:
            for d in c.delta.tool_calls or []:
                fragments.setdefault(d.index, []).append(d)
    final = state.get_final_completion().choices[0].message.tool_calls
    check_calls(final)
    assert [(c.id, c.function.name, c.function.arguments) for c in final] == [
        (f[0].id, f[0].function.name, "".join(d.function.arguments for d in f)) for f in fragments.values()]
    assert [(c.function.name, c.function.arguments) for c in final] == [
        (c.function.name, c.function.arguments) for c in whole]
    assert sdk_deltas == {i: c.function.arguments for i, c in enumerate(final)}
    for frags in fragments.values():
        first, *later = frags
        assert first.id and first.type == "function" and first.function.name, first
        assert later, f"arguments arrived whole: {first}"
        for d in later:
            assert d.id is None and d.type is None and d.function.name is None and d.function.arguments, d


def test_auto_parses_calls_the_model_writes(client):
    """With tool_choice auto, a call in the model's format is parsed out of its
    output (the output is steered with a regex so the random model writes one,
    with text before it)."""
    forced = r'Checking\.<tool_call>\n\{"name": "get_time", "arguments": \{"zone": "UTC"\}\}\n</tool_call>'
    args = dict(model=MODEL, messages=MESSAGES, tools=TOOLS, max_tokens=100, temperature=0,
                extra_body={"structured_outputs": {"regex": forced}})
    choice = client.chat.completions.create(**args).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Checking."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
        ("get_time", {"zone": "UTC"})]
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**args, stream=True)
                   if c.choices)
    assert text == "Checking."
    # Without tools the same output is plain text.
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=100, temperature=0,
                                           extra_body={"structured_outputs": {"regex": forced}}).choices[0]
    assert plain.finish_reason == "stop" and "<tool_call>" in plain.message.content


def test_tool_choice_none_renders_no_tools(client):
    with_tools = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, max_tokens=3,
                                                temperature=0, extra_body={"ignore_eos": True})
    without = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="none",
                                             max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    bare = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3, temperature=0,
                                          extra_body={"ignore_eos": True})
    assert without.usage.prompt_tokens == bare.usage.prompt_tokens < with_tools.usage.prompt_tokens
    assert without.choices[0].message.tool_calls is None


def test_a_call_and_its_result_go_back_into_the_conversation(client):
    first = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, temperature=0, max_tokens=300).choices[0]
    call = first.message.tool_calls[0]
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "{\"temp\": 21}"},
    ]
    reply = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=5, temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_grpc_typed_tool_calls(qwen):
    tools = [{"type": "function", "function": {"name": t["function"]["name"],
                                                "parameters": json.dumps(t["function"]["parameters"])}}
             for t in TOOLS]
    req = {"chat": {"messages": MESSAGES, "tools": tools, "toolChoice": {"mode": "REQUIRED"},
                    "parallelToolCalls": False},
           "maxTokens": 300, "sampling": {"temperature": 0}}
    events = harness.buf_curl(qwen.grpc, "gyre.v1.Generation/GenerateStream", req).ok().messages
    fragments = [c for e in events if "delta" in e for c in e["delta"].get("toolCalls", [])]
    text = "".join(e["delta"].get("text", "") for e in events if "delta" in e)
    # One call, its arguments in several fragments: the first names it.
    assert {f.get("index", 0) for f in fragments} == {0} and text == "", events
    first, *later = fragments
    assert first["name"] in SCHEMAS and ID.fullmatch(first["id"])
    assert later and all("id" not in f and "name" not in f and f["arguments"] for f in later), fragments
    arguments = "".join(f.get("arguments", "") for f in fragments)
    jsonschema.validate(json.loads(arguments), SCHEMAS[first["name"]])
    assert events[-1]["finish"]["reason"] == "FINISH_REASON_TOOL_CALLS"


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "function": {"description": "x"}}]}, "tools[0].function.name"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
        # Arguments are an object: a schema of anything else is refused.
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
          "tool_choice": "required"}, "tools[0].function.parameters"),
        # A schema that cannot be enforced is the tool's fault, not
        # response_format's (the forcing grammar it became).
        ({"tools": [TOOLS[0], {"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "strin"}}}}}],
          "tool_choice": "required"}, "tools[1].function.parameters"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_bad_tool_requests_are_400(qwen, extra, param, stream):
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 5, "stream": stream, **extra}
    reply = harness.http_json(qwen.http, "/v1/chat/completions", body)
    assert reply.status == 400, reply.body
    openai_schema.validate("ErrorResponse", reply.json())
    assert reply.json()["error"]["param"] == param, reply.body


def test_sdk_raises_for_tool_choice_without_tools(client):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, tool_choice="required", max_tokens=5)
