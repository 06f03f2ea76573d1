"""vLLM-compatible utility routes of the shim: POST /tokenize (prompt or chat
messages, checked against transformers' ids from the golden file),
POST /detokenize, GET /health (200 ready, 503 when the gRPC service is
unreachable) and GET /version; probes need no API key."""

import harness

MODEL = "tiny-qwen2"


def test_tokenize_prompt_matches_transformers(qwen):
    g = harness.golden(MODEL)
    reply = harness.http_json(qwen.http, "/tokenize", {"model": MODEL, "prompt": g["prompt"]})
    assert reply.status == 200, reply.body
    out = reply.json()
    assert out["tokens"] == g["prompt_ids"]
    assert out["count"] == len(g["prompt_ids"]) and out["max_model_len"] == 2048


def test_tokenize_messages_matches_transformers_chat_template(qwen):
    for case in harness.golden(MODEL)["chat_renders"]:
        if "text" not in case:
            continue
        body = {"model": MODEL, "messages": case["messages"],
                "add_generation_prompt": case["add_generation_prompt"]}
        reply = harness.http_json(qwen.http, "/tokenize", body)
        assert reply.status == 200, reply.body
        assert reply.json()["tokens"] == case["token_ids"], case["messages"]


def test_detokenize_round_trips(qwen):
    g = harness.golden(MODEL)
    reply = harness.http_json(qwen.http, "/detokenize", {"model": MODEL, "tokens": g["prompt_ids"]})
    assert reply.status == 200, reply.body
    assert reply.json() == {"prompt": g["prompt"]}


def test_utility_route_errors_are_openai_shaped(qwen):
    cases = [
        ("/tokenize", {"model": MODEL}, 400, "prompt"),
        ("/tokenize", {"model": MODEL, "prompt": "a", "messages": [{"role": "user", "content": "b"}]}, 400, "prompt"),
        ("/tokenize", {"model": "nope", "prompt": "a"}, 404, None),
        ("/tokenize", {"model": MODEL, "messages": [{"role": "wizard", "content": "b"}]}, 400, "messages[0].role"),
        ("/detokenize", {"model": MODEL}, 400, "tokens"),
        ("/detokenize", {"model": MODEL, "tokens": [999999999]}, 400, "tokens"),
        ("/detokenize", {"model": MODEL, "tokens": "abc"}, 400, "tokens"),
    ]
    for path, body, status, param in cases:
        reply = harness.http_json(qwen.http, path, body)
        assert reply.status == status, (path, body, reply.body)
        err = reply.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        if param is not None:
            assert err["param"] == param, (path, body, err)


def test_health_and_version_need_no_key(keyed):
    assert harness.http_request(keyed.http, "GET", "/health").status == 200
    version = harness.http_json(keyed.http, "/version", method="GET")
    assert version.status == 200 and version.json()["version"]
    # The other utility routes are guarded like /v1.
    assert harness.http_json(keyed.http, "/tokenize", {"model": MODEL, "prompt": "a"}).status == 401


def test_health_is_503_when_the_service_is_unreachable():
    # Port 1 on loopback: nothing listens there.
    shim = harness.Server.start(
        [str(harness.SHIM_BIN), "--grpc-endpoint", "http://127.0.0.1:1", "--http-addr", "127.0.0.1:0"],
        want=("HTTP",),
    )
    try:
        reply = harness.http_request(shim.http, "GET", "/health")
        assert reply.status == 503, reply.body
        assert harness.http_request(shim.http, "GET", "/version").status == 200
    finally:
        shim.stop()
        shim.remove_log()


def test_legacy_function_role_renders_as_a_tool_result(qwen):
    """OpenAI's legacy `function` role (a function's result) is rendered as the
    template's `tool` role; `developer` is accepted as a role of its own."""
    def tokens(role):
        messages = [
            {"role": "developer", "content": "Answer briefly."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "Let me check."},
            {"role": role, "name": "get_weather", "content": "22 C, sunny"},
        ]
        reply = harness.http_json(qwen.http, "/tokenize", {"model": MODEL, "messages": messages,
                                                           "add_generation_prompt": True})
        assert reply.status == 200, reply.body
        return reply.json()["tokens"]

    as_function, as_tool = tokens("function"), tokens("tool")
    assert as_function == as_tool
    detok = harness.http_json(qwen.http, "/detokenize", {"model": MODEL, "tokens": as_function})
    assert "22 C, sunny" in detok.json()["prompt"]
    bad = harness.http_json(qwen.http, "/tokenize", {"model": MODEL, "messages": [{"role": "robot", "content": "x"}]})
    assert bad.status == 400 and bad.json()["error"]["param"] == "messages[0].role", bad.body
