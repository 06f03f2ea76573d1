"""LangChain's `ChatOpenAI` (langchain-openai, from the compat venv: `make
compat`) against a live gyre serving the real default model
(SmolLM2-135M-Instruct): `invoke`, `stream`, `bind_tools` with a forced named
tool, and `with_structured_output` with a Pydantic model (json_schema).

The script (tests/compat/langchain_chat.py) records the JSON body of every
request LangChain sends; each answer must equal what the project's OpenAI SDK
gets from gyre for that same body (greedy decoding, temperature 0), so a gyre
that answered LangChain differently, or broke its parsing, fails here.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

import compat_util as cu

WEATHER = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]},
                   "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def server(module_server):
    return module_server(cu.DEFAULT_GGUF)


@pytest.fixture(scope="module")
def sdk(server):
    return cu.sdk(f"http://{server.http}/v1")


@pytest.fixture(scope="module")
def out(server) -> dict:
    return cu.run_script("langchain_chat.py", f"http://{server.http}/v1", cu.DEFAULT)


def sent(out: dict, name: str) -> dict:
    """The body LangChain sent for call `name` (to /v1/chat/completions)."""
    req = out["requests"][name]
    assert req["path"] == "/v1/chat/completions", req
    assert req["body"]["model"] == cu.DEFAULT and req["body"]["temperature"] == 0, req
    return req["body"]


def sdk_stream(sdk, body: dict) -> tuple[str, str, dict]:
    """(content, finish_reason, the tool call's name and joined arguments) of the SDK's stream."""
    content, finish, call = "", None, {"name": "", "arguments": ""}
    for chunk in sdk.chat.completions.create(**body):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for tc in choice.delta.tool_calls or []:
                if tc.function:
                    call["name"] += tc.function.name or ""
                    call["arguments"] += tc.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, finish, call


def test_versions_are_the_pinned_ones(out):
    assert out["versions"]["langchain-openai"] == cu.pinned("langchain-openai"), out["versions"]
    assert out["versions"]["openai"] == cu.pinned("openai"), out["versions"]


@pytest.mark.parametrize("name", ["invoke", "invoke_length"])
def test_invoke_equals_the_sdk(out, sdk, name):
    body = sent(out, name)
    assert body["stream"] is False
    got = out[name]
    ref = sdk.chat.completions.create(**body)
    assert got["content"] == ref.choices[0].message.content, (got, ref)
    assert got["finish"] == ref.choices[0].finish_reason, (got, ref)
    assert got["model"] == cu.DEFAULT
    usage = got["usage"]
    assert (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]) == cu.usage_counts(ref.usage)
    if name == "invoke":
        assert "Paris" in got["content"] and got["finish"] == "stop", got
    else:
        # ChatOpenAI(max_tokens=12) is sent as max_completion_tokens.
        assert body["max_completion_tokens"] == 12, body
        assert got["finish"] == "length" and usage["output_tokens"] == 12, got


def test_stream_joins_to_the_invoked_text(out, sdk):
    body = sent(out, "stream")
    assert body["stream"] is True
    got = out["stream"]
    assert got["content"] == out["invoke"]["content"], (got, out["invoke"])
    assert got["finish"] == "stop", got
    assert sum(1 for p in got["pieces"] if p) >= 3, got["pieces"]
    content, finish, _ = sdk_stream(sdk, body)
    assert (got["content"], got["finish"]) == (content, finish)


def test_bind_tools_with_a_forced_tool(out, sdk):
    body = sent(out, "tools")
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}, body
    assert [t["function"]["name"] for t in body["tools"]] == ["get_weather"], body
    got = out["tools"]
    assert got["finish"] == "tool_calls" and len(got["tool_calls"]) == 1, got
    call = got["tool_calls"][0]
    assert call["name"] == "get_weather" and call["id"], call
    jsonschema.validate(call["args"], WEATHER)
    ref = sdk.chat.completions.create(**body)
    [ref_call] = ref.choices[0].message.tool_calls
    assert ref_call.function.name == "get_weather"
    assert call["args"] == json.loads(ref_call.function.arguments), (call, ref_call)

    # Streamed: LangChain joins the argument deltas into the same call.
    body = sent(out, "tools_stream")
    assert body["stream"] is True and body["tool_choice"] == out["requests"]["tools"]["body"]["tool_choice"]
    streamed = out["tools_stream"]
    assert streamed["finish"] == "tool_calls" and len(streamed["tool_calls"]) == 1, streamed
    assert streamed["tool_calls"][0]["name"] == "get_weather" and streamed["tool_calls"][0]["id"]
    assert streamed["tool_calls"][0]["args"] == call["args"], (streamed, call)
    assert streamed["chunks"] >= 3, streamed
    _, finish, ref_call = sdk_stream(sdk, body)
    assert finish == "tool_calls" and ref_call["name"] == "get_weather", ref_call
    assert json.loads(ref_call["arguments"]) == call["args"], ref_call


def test_with_structured_output_json_schema(out, sdk):
    body = sent(out, "structured")
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "CityFacts", fmt
    assert fmt["json_schema"]["strict"] is True, fmt
    got = out["structured"]
    jsonschema.validate(got["parsed"], got["schema"])
    assert set(got["parsed"]) == {"city", "country", "is_capital"}, got
    assert got["parsed"]["city"] == "Paris", got
    raw = got["raw"]
    assert raw["finish"] == "stop" and json.loads(raw["content"]) == got["parsed"], raw
    ref = sdk.chat.completions.create(**body)
    assert raw["content"] == ref.choices[0].message.content, (raw, ref)
