"""Tool-call arguments stream incrementally in every format, through the
shim's SSE and the official OpenAI SDK.

The models' weights are random, so calls are forced (`tool_choice`
required or named) by constrained decoding in each format's own markup:
tiny-mistral's real template asks for Mistral's `[TOOL_CALLS][...]`
(detected), tiny-llama is served as `llama3_json` and, by detection from
its plain template, as `json`, and tiny-qwen2 as `deepseek` (the markers are
plain text to its tokenizer, which the parser reads all the same). In every
format a call's first stream fragment carries `index`, `id`, `type` and the
name, later fragments only more argument text, and the fragments of a call
concatenate to exactly the arguments of the same request not streamed.
"""

import json
import re

import jsonschema
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

import openai_schema

MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Oslo", "Lima"]},
        "note": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "note", "days"],
    "additionalProperties": False,
}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ID = re.compile(r"[A-Za-z0-9]{9,}")

# format -> (model, extra server flags)
SERVERS = {
    "mistral": ("tiny-mistral", ()),
    "llama3_json": ("tiny-llama", ("--tool-call-parser", "llama3_json")),
    "json": ("tiny-llama", ()),
    "deepseek": ("tiny-qwen2", ("--tool-call-parser", "deepseek")),
}


@pytest.fixture(scope="module")
def clients(model_server, start_server):
    """format -> (model name, an OpenAI SDK client of a server using it)."""
    made = {}
    for fmt, (model, flags) in SERVERS.items():
        server = start_server(model, *flags) if flags else model_server(model)
        made[fmt] = (model, openai.OpenAI(base_url=f"http://{server.http}/v1", api_key="unused", max_retries=0,
                                          timeout=120))
    return made


def stream(client, **args):
    """Streams a request: (the message as the SDK accumulates it, fragments by call index, finish reason)."""
    state = ChatCompletionStreamState()
    fragments: dict[int, list] = {}
    finish = None
    for chunk in client.chat.completions.create(**args, stream=True):
        openai_schema.validate("CreateChatCompletionStreamResponse", chunk.model_dump(exclude_unset=True))
        state.handle_chunk(chunk)
        for c in chunk.choices:
            assert not c.delta.content, c.delta  # no markup reaches content
            for d in c.delta.tool_calls or []:
                fragments.setdefault(d.index, []).append(d)
            finish = c.finish_reason or finish
    # The SDK's accumulation (its snapshot: the parsed final completion refuses a `length` finish).
    return state.current_completion_snapshot.choices[0].message, fragments, finish


def check_fragments(fragments, calls):
    """Each call's first fragment names it, later ones carry only argument text, and they concatenate to the
    call's arguments; the arguments came in several fragments."""
    assert sorted(fragments) == list(range(len(calls))), fragments
    for i, call in enumerate(calls):
        first, *later = fragments[i]
        assert first.id == call.id and ID.fullmatch(first.id), first
        assert first.type == "function" and first.function.name == call.function.name, first
        assert later, f"call {i} arrived whole: {first}"
        for d in later:
            assert d.index == i and d.id is None and d.type is None and d.function.name is None, d
            assert d.function.arguments, d
        assert "".join(d.function.arguments or "" for d in fragments[i]) == call.function.arguments


@pytest.mark.parametrize("fmt", list(SERVERS))
def test_forced_call_streams_its_arguments(clients, fmt):
    """parallel_tool_calls false: exactly one call, its arguments streamed in fragments that concatenate to the
    non-streamed call's arguments, which are valid against the tool's schema."""
    model, client = clients[fmt]
    args = dict(model=model, messages=MESSAGES, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                temperature=0, max_tokens=200)
    whole = client.chat.completions.create(**args).choices[0]
    assert whole.finish_reason == "tool_calls", whole
    assert len(whole.message.tool_calls) == 1 and whole.message.content is None, whole.message
    message, fragments, finish = stream(client, **args)
    assert finish == "tool_calls"
    check_fragments(fragments, message.tool_calls)
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    call = message.tool_calls[0]
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("fmt", list(SERVERS))
def test_parallel_calls_stream_each_in_fragments(clients, fmt):
    """Several calls (sampled, so the model decides how many): each streams in fragments with its own index and
    id; a random model may go on calling until max_tokens, and then its last call is the text it had."""
    model, client = clients[fmt]
    args = dict(model=model, messages=MESSAGES, tools=TOOLS, tool_choice="required", parallel_tool_calls=True,
                temperature=1.0, seed=5, max_tokens=120)
    whole = client.chat.completions.create(**args).choices[0]
    message, fragments, finish = stream(client, **args)
    assert finish == whole.finish_reason and finish in ("tool_calls", "length"), finish
    check_fragments(fragments, message.tool_calls)
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert len({c.id for c in message.tool_calls}) == len(message.tool_calls)
    complete = message.tool_calls if finish == "tool_calls" else message.tool_calls[:-1]
    for call in complete:
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("fmt", ["mistral", "llama3_json"])
def test_a_call_cut_off_by_max_tokens_keeps_what_was_streamed(clients, fmt):
    """An output that ends inside a call's arguments (max_tokens) finishes `length` with the call as far as it
    was written: the streamed fragments concatenate to exactly the non-streamed arguments, a prefix of the
    arguments the model writes given room."""
    model, client = clients[fmt]
    args = dict(model=model, messages=MESSAGES, tools=TOOLS, temperature=0, parallel_tool_calls=False,
                tool_choice={"type": "function", "function": {"name": "get_weather"}})
    full = client.chat.completions.create(**args, max_tokens=200).choices[0].message.tool_calls[0].function.arguments
    cut = None
    for max_tokens in range(2, 80):
        choice = client.chat.completions.create(**args, max_tokens=max_tokens).choices[0]
        if choice.message.tool_calls and len(choice.message.tool_calls[0].function.arguments) >= 8:
            cut = max_tokens
            break
    assert cut is not None, "no max_tokens cut the arguments"
    assert choice.finish_reason == "length", choice
    partial = choice.message.tool_calls[0].function.arguments
    assert full.startswith(partial) and partial != full, (partial, full)
    message, fragments, finish = stream(client, **args, max_tokens=cut)
    assert finish == "length"
    check_fragments(fragments, message.tool_calls)
    assert message.tool_calls[0].function.arguments == partial
