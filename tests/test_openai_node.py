"""The official OpenAI Node SDK (`openai` from npm, installed by `make setup`)
against a live gyre: chat whole and streamed (the greedy stream spells the
whole answer's text, usage in the last chunk), a named tool call whole and
streamed (arguments valid against the tool's schema, the streamed pieces
joining to the whole call), and the SDK's typed error for an unknown model.
The script is `tests/node/openai_node.mjs`.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import jsonschema

import harness
from conftest import QWEN

WEATHER = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]},
                   "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}


def run_node(server: harness.Server) -> dict:
    node = shutil.which("node")
    assert node, "node is not installed (make setup needs Node 20)"
    p = subprocess.run([node, str(harness.REPO / "tests" / "node" / "openai_node.mjs"),
                        f"http://{server.http}/v1", QWEN], capture_output=True, text=True, timeout=300,
                       cwd=harness.REPO)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_the_openai_node_sdk(qwen):
    out = run_node(qwen)
    whole, stream = out["whole"], out["stream"]
    assert whole["content"] and whole["finish"] in ("stop", "length"), whole
    assert stream["content"] == whole["content"], (stream, whole)
    assert stream["finish"] == whole["finish"] and stream["chunks"] >= 3, stream
    # The same counts (the second run's prompt comes from the prefix cache).
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [stream["usage"][k] for k in counts] == [whole["usage"][k] for k in counts], stream
    assert stream["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, stream["usage"]
    assert whole["usage"]["completion_tokens"] <= 12

    tools = out["tools"]
    assert tools["finish"] == "tool_calls" and len(tools["calls"]) == 1, tools
    call = tools["calls"][0]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather", call
    args = json.loads(call["function"]["arguments"])
    jsonschema.validate(args, WEATHER)
    streamed = out["toolStream"]
    assert streamed["finish"] == "tool_calls" and len(streamed["calls"]) == 1, streamed
    piece = streamed["calls"][0]
    assert piece["name"] == "get_weather" and piece["id"], piece
    assert json.loads(piece["arguments"]) == args

    err = out["error"]
    assert err["status"] == 404 and err["name"] == "NotFoundError", err
    assert err["code"] == "model_not_found", err
