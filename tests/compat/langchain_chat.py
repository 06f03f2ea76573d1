"""LangChain's `ChatOpenAI` against gyre (run by tests/test_langchain.py with
the compat venv's python): `python langchain_chat.py BASE_URL MODEL`.

Prints one JSON object: what each call returned, plus the JSON body of every
request LangChain sent (recorded with an httpx event hook), so the test can
check the request and send the same one with the OpenAI SDK.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version

import httpx
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

BASE_URL, MODEL = sys.argv[1], sys.argv[2]
QUESTION = "What is the capital of France?"
POEM = "Write a poem about the sea."
WEATHER_QUESTION = "What is the weather in Paris?"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]},
                           "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
CITY_QUESTION = "Describe Paris: its name, its country, and whether it is a capital."


class CityFacts(BaseModel):
    """Facts about a city."""

    city: str = Field(description="The city's name")
    country: str = Field(description="The country it is in")
    is_capital: bool = Field(description="Whether it is the country's capital")


requests: dict[str, dict] = {}  # the body of each call's request, by the call's name
current = ""


def record(request: httpx.Request) -> None:
    assert current not in requests, f"{current} sent a second request"
    requests[current] = {"path": request.url.path, "body": json.loads(request.read() or b"null")}


def run(name: str, fn):
    global current
    current = name
    return fn()


def chat(**kw) -> ChatOpenAI:
    return ChatOpenAI(model=MODEL, base_url=BASE_URL, api_key="unused", temperature=0, max_retries=0,
                      timeout=120, http_client=httpx.Client(event_hooks={"request": [record]}), **kw)


def message(msg) -> dict:
    return {"content": msg.content, "finish": msg.response_metadata.get("finish_reason"),
            "model": msg.response_metadata.get("model_name"), "usage": msg.usage_metadata,
            "tool_calls": [{"name": c["name"], "args": c["args"], "id": c["id"]} for c in msg.tool_calls]}


def streamed(runnable, prompt) -> dict:
    chunks = list(runnable.stream(prompt))
    merged = chunks[0]
    for c in chunks[1:]:
        merged = merged + c
    return {**message(merged), "chunks": len(chunks),
            "pieces": [c.content for c in chunks]}


def main() -> None:
    out: dict = {"versions": {p: version(p) for p in ("langchain-openai", "langchain-core", "openai")}}
    llm = chat()
    out["invoke"] = run("invoke", lambda: message(llm.invoke(QUESTION)))
    out["invoke_length"] = run("invoke_length", lambda: message(chat(max_tokens=12).invoke(POEM)))
    out["stream"] = run("stream", lambda: streamed(llm, QUESTION))

    tools = llm.bind_tools([WEATHER_TOOL], tool_choice="get_weather")
    out["tools"] = run("tools", lambda: message(tools.invoke(WEATHER_QUESTION)))
    out["tools_stream"] = run("tools_stream", lambda: streamed(tools, WEATHER_QUESTION))

    structured = llm.with_structured_output(CityFacts, method="json_schema", include_raw=True)
    res = run("structured", lambda: structured.invoke(CITY_QUESTION))
    assert res["parsing_error"] is None, res["parsing_error"]
    assert isinstance(res["parsed"], CityFacts), type(res["parsed"])
    out["structured"] = {"parsed": res["parsed"].model_dump(), "raw": message(res["raw"]),
                         "schema": CityFacts.model_json_schema()}
    out["requests"] = requests
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
