"""Bad input to `POST /v1/responses` against a real `gyre serve`: each field
wrong (a wrong JSON type, checked by the shim; a value out of range or a
conflict, checked by the service) is a 400 in OpenAI's error shape whose
`param` names the field in OpenAI's spelling, streamed or not, before any
event is sent.
"""

from __future__ import annotations

import openai
import pytest

import harness
import openai_schema as spec
import responses_util as ru
from conftest import QWEN

BODY = {"model": QWEN, "input": "Hi", "max_output_tokens": 4, "temperature": 0}
USER = {"role": "user", "content": "Hi"}

CASES = {
    # Wrong JSON types (the shim).
    "input type": ({"input": 5}, "input"),
    "item type": ({"input": [USER, {"type": 7}]}, "input[1].type"),
    "part text type": ({"input": [USER, {"role": "user", "content": [{"type": "input_text", "text": 1}]}]},
                       "input[1].content[0].text"),
    "content type": ({"input": [{"role": "user", "content": 3}]}, "input[0].content"),
    "image part": ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
                   "input[0].content[0].type"),
    "call without call_id": ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
                             "input[0].call_id"),
    "output type": ({"input": [{"type": "function_call_output", "call_id": "c", "output": 1}]},
                    "input[0].output"),
    "tool type": ({"tools": [{"type": "function", "name": "f"}, {"type": "web_search"}]}, "tools[1].type"),
    "tool name": ({"tools": [{"type": "function"}]}, "tools[0].name"),
    "tool parameters": ({"tools": [{"type": "function", "name": "f", "parameters": "x"}]},
                        "tools[0].parameters"),
    "tool_choice value": ({"tool_choice": "sometimes"}, "tool_choice"),
    "tool_choice type": ({"tool_choice": {"type": "web_search"}}, "tool_choice.type"),
    "text format type": ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
    "json_schema without schema": ({"text": {"format": {"type": "json_schema", "name": "x"}}},
                                   "text.format.schema"),
    "temperature type": ({"temperature": "hot"}, "temperature"),
    "max_output_tokens type": ({"max_output_tokens": "many"}, "max_output_tokens"),
    "metadata value type": ({"metadata": {"k": 1}}, "metadata.k"),
    "store type": ({"store": "yes"}, "store"),
    "reasoning effort type": ({"reasoning": {"effort": 3}}, "reasoning.effort"),
    "conversation type": ({"conversation": 5}, "conversation"),
    # Ranges, limits and conflicts (the service).
    "max_output_tokens 0": ({"max_output_tokens": 0}, "max_output_tokens"),
    "temperature range": ({"temperature": 3}, "temperature"),
    "top_p range": ({"top_p": 1.5}, "top_p"),
    "top_logprobs range": ({"top_logprobs": 21}, "top_logprobs"),
    "metadata keys": ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    "metadata key length": ({"metadata": {"k" * 65: "v"}}, "metadata"),
    "metadata value length": ({"metadata": {"k": "v" * 513}}, "metadata"),
    "role": ({"input": [{"role": "robot", "content": "Hi"}]}, "input[0].role"),
    "conversation with previous_response_id": ({"conversation": "conv_x", "previous_response_id": "resp_x"},
                                               "conversation"),
    "background without store": ({"background": True, "store": False}, "background"),
    "truncation": ({"truncation": "sometimes"}, "truncation"),
    "include value": ({"include": ["file_search_call.results"]}, "include[0]"),
    "service_tier": ({"service_tier": "gold"}, "service_tier"),
    "duplicate item ids": ({"input": [{**USER, "type": "message", "id": "msg_d"},
                                      {**USER, "type": "message", "id": "msg_d"}]}, "input[1].id"),
}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_a_400_naming_the_param(qwen, case, stream):
    patch, param = CASES[case]
    reply = ru.post(qwen.http, "/v1/responses", {**BODY, **patch, "stream": stream})
    assert reply.status == 400, reply.body[:500]
    assert reply.headers.get("content-type", "").startswith("application/json")
    body = reply.json()
    spec.validate(spec.ERROR, body)
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["param"] == param, body


def test_sdk_raises_bad_request(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=QWEN, input="Hi", tools=[{"type": "web_search"}])
    assert err.value.body["param"] == "tools[0].type"


def test_input_tokens_checks_the_same_fields(qwen):
    reply = ru.post(qwen.http, "/v1/responses/input_tokens", {**BODY, "tools": [{"type": "file_search"}]})
    assert reply.status == 400
    assert reply.json()["error"]["param"] == "tools[0].type"


@pytest.mark.parametrize("query,param", [("stream=maybe", "stream"), ("stream=true&starting_after=x", "starting_after")])
def test_bad_query_parameters(qwen, query, param):
    r = ru.create(qwen.http, BODY)
    reply = harness.http_request(qwen.http, "GET", f"/v1/responses/{r['id']}?{query}")
    assert reply.status == 400
    assert reply.json()["error"]["param"] == param
