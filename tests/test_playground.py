"""The playground page of `gyre serve` (issue 16), in a real browser.

- Headless Chromium (Debian's package, installed by `make chromium`) driven
  by Playwright (the `playwright` package of requirements-dev.txt, pointed at
  that Chromium; no browser is downloaded) loads `/playground` from a server
  of the real default model (SmolLM2-135M-Instruct), picks the model, sends
  a prompt, and sees the text stream in (at least two different partial
  texts before the end, each a prefix of the next) to the same answer the
  HTTP API gives, with TTFT and tokens/s shown. A second, endless
  generation (ignore EOS) is stopped from the page mid-stream: the page
  stops growing, and the engine (GetStats over gRPC) gets back to nothing
  running and its idle KV block count, and generates no more tokens. The
  page's own engine panel shows the generation running, then not.
  Screenshots go to $GYRE_ARTIFACTS (default .gyre/artifacts).
- Without a browser: `--no-playground` leaves `/playground` a 404 and the
  gRPC port without CORS; with it the page's origin, and only it, gets
  CORS on the gRPC port, and a gRPC-Web call from it is answered.
- The page's hand-written gRPC-Web module (`grpcweb.js`) in Node, checked
  against the real protobuf classes: the requests it encodes parse to the
  intended messages, it decodes what protobuf encodes (unknown fields
  skipped), frames split anywhere, and errors are errors; and its Client
  against a live gRPC port.

Chromium or Playwright missing fails the browser test, saying how to
install it: it is never skipped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

import browser_util
import harness
from conftest import QWEN

sys.path.insert(0, str(harness.REPO / "clients" / "python"))
from gyre.v1 import generate_pb2 as pb  # noqa: E402
from gyre.v1 import generate_pb2_grpc as pb_grpc  # noqa: E402

GRPCWEB_JS = harness.REPO / "shim" / "src" / "playground" / "assets" / "grpcweb.js"
CODEC_SCRIPT = harness.REPO / "tests" / "node" / "playground_codec.mjs"
DEFAULT_MODEL = harness.REPO / ".gyre" / "models" / "smollm2-135m-instruct.gguf"
MODEL = "smollm2-135m-instruct"
ARTIFACTS = Path(os.environ.get("GYRE_ARTIFACTS") or harness.REPO / ".gyre" / "artifacts").absolute()
QUESTION = "What is the capital of France?"


# ---------------------------------------------------------------------------
# The gRPC-Web module in Node


def node() -> str:
    found = shutil.which("node")
    assert found, "node is not installed (make setup needs Node 20)"
    return found


def run_codec(tmp_path: Path, payload: dict) -> dict:
    # An .mjs copy: Node 20 reads a .js file outside an ESM package as CommonJS.
    module = tmp_path / "grpcweb.mjs"
    shutil.copy(GRPCWEB_JS, module)
    p = subprocess.run([node(), str(CODEC_SCRIPT), str(module)], input=json.dumps(payload),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"{CODEC_SCRIPT.name}:\n{p.stderr}"
    return json.loads(p.stdout)


def grpc_web_body(messages: list[bytes], trailers: str) -> bytes:
    data = b"".join(b"\x00" + struct.pack(">I", len(m)) + m for m in messages)
    t = trailers.encode()
    return data + b"\x80" + struct.pack(">I", len(t)) + t


REQUESTS = [
    ({"model": "m-1", "messages": [{"role": "user", "content": "héllo ✓ 🦀"}], "maxTokens": 300,
      "temperature": 0, "ignoreEos": True},
     pb.Request(model="m-1", chat=pb.ChatInput(messages=[pb.ChatMessage(role="user", content="héllo ✓ 🦀")]),
                max_tokens=300, sampling=pb.SamplingParams(temperature=0.0), ignore_eos=True)),
    ({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": ""}],
      "temperature": 0.7, "maxTokens": 2 ** 31},
     pb.Request(chat=pb.ChatInput(messages=[pb.ChatMessage(role="system", content="Be brief."),
                                            pb.ChatMessage(role="user", content="")]),
                sampling=pb.SamplingParams(temperature=0.7), max_tokens=2 ** 31)),
    ({"text": "Once upon a time"}, pb.Request(text="Once upon a time")),
    ({"text": ""}, pb.Request(text="")),
]

DELTA = pb.GenerateResponse(
    request_id="req-1", delta=pb.Delta(text="Par", token_ids=[12, 300, 70000],
                                       logprobs=[pb.TokenLogprob(token_id=12, logprob=-0.5, token="P")]))
DELTA2 = pb.GenerateResponse(request_id="req-1", index=3, delta=pb.Delta(text="is ✓", token_ids=[5]))
FINISH = pb.GenerateResponse(
    request_id="req-1", finish=pb.Finish(reason=pb.FINISH_REASON_LENGTH, matched_stop="\n\n",
                                         usage=pb.Usage(prompt_tokens=9, completion_tokens=4, cached_tokens=0,
                                                        reasoning_tokens=0)))
FAILED = pb.GenerateResponse(
    request_id="req-2", finish=pb.Finish(reason=pb.FINISH_REASON_ERROR,
                                         error=pb.RequestError(code=3, message="bad", reason="WHY", field="f")))
STATS = pb.EngineStats(model="m-1", waiting=2, running=1, block_size=16, kv_blocks_total=4096, kv_blocks_used=7,
                       kv_blocks_cached=3, prefix_query_tokens_total=2 ** 40 + 3, prefix_hit_tokens_total=96,
                       last_step_tokens=5, steps_total=2 ** 33, preemptions_total=1, generated_tokens_total=12345,
                       draft_kv_blocks_total=9)
MODELS = pb.ListModelsResponse(models=[
    pb.Model(id="m-1", owned_by="gyre", created=1_700_000_000, max_model_len=8192, vocab_size=49152,
             architecture="LlamaForCausalLM", aliases=["a", "b"], kind="generate", chat=True, sunset=1_800_000_000),
    pb.Model(id="emb", kind="embed"),
])

EXPECTED = [
    {"requestId": "req-1", "index": 0, "delta": {"text": "Par", "tokenIds": [12, 300, 70000], "reasoning": ""}},
    {"requestId": "req-1", "index": 3, "delta": {"text": "is ✓", "tokenIds": [5], "reasoning": ""}},
    {"requestId": "req-1", "index": 0,
     "finish": {"reason": 2, "matchedStop": "\n\n",
                "usage": {"promptTokens": 9, "completionTokens": 4, "cachedTokens": 0}}},
    {"requestId": "req-2", "index": 0,
     "finish": {"reason": 4, "matchedStop": "",
                "error": {"code": 3, "message": "bad", "reason": "WHY", "field": "f"}}},
    {"model": "m-1", "waiting": 2, "running": 1, "blockSize": 16, "kvBlocksTotal": 4096, "kvBlocksUsed": 7,
     "kvBlocksCached": 3, "prefixQueryTokensTotal": 2 ** 40 + 3, "prefixHitTokensTotal": 96, "lastStepTokens": 5,
     "stepsTotal": 2 ** 33, "preemptionsTotal": 1, "generatedTokensTotal": 12345},
    {"models": [
        {"id": "m-1", "ownedBy": "gyre", "maxModelLen": 8192, "architecture": "LlamaForCausalLM",
         "aliases": ["a", "b"], "kind": "generate", "chat": True},
        {"id": "emb", "ownedBy": "", "maxModelLen": 0, "architecture": "", "aliases": [], "kind": "embed",
         "chat": False}]},
]


def test_the_grpc_web_module_speaks_gyre_v1(tmp_path, qwen):
    body = grpc_web_body([DELTA.SerializeToString(), DELTA2.SerializeToString(), b""],
                         "grpc-status:0\r\ngrpc-message: all%20good\r\n")
    out = run_codec(tmp_path, {
        "requests": [r for r, _ in REQUESTS],
        "statsModels": ["", MODEL],
        "decode": [{"type": "GenerateResponse", "hex": m.SerializeToString().hex()}
                   for m in (DELTA, DELTA2, FINISH, FAILED)]
        + [{"type": "EngineStats", "hex": STATS.SerializeToString().hex()},
           {"type": "ListModelsResponse", "hex": MODELS.SerializeToString().hex()}],
        "frame": DELTA.SerializeToString().hex(),
        "body": body.hex(),
        "malformed": ["78", "0a05", "0a0561", "0801", "7b", "1202ffff"],
        "live": f"http://{qwen.grpc}",
        "liveText": "The capital of France is",
    })
    # What it encodes parses to the intended messages, fields present as set.
    for (args, want), got in zip(REQUESTS, out["requests"], strict=True):
        parsed = pb.Request.FromString(bytes.fromhex(got))
        assert parsed == want, (args, parsed)
        assert parsed.WhichOneof("input") == want.WhichOneof("input")
        assert parsed.HasField("sampling") == want.HasField("sampling")
        if want.HasField("sampling"):
            assert parsed.sampling.HasField("temperature")
        assert parsed.HasField("max_tokens") == want.HasField("max_tokens")
    assert [bytes.fromhex(h) for h in out["getStats"]] == \
        [pb.GetStatsRequest(model=m).SerializeToString() for m in ("", MODEL)]
    # What protobuf encodes it decodes, skipping the fields it does not use.
    assert out["decoded"] == EXPECTED
    assert bytes.fromhex(out["framed"]) == b"\x00" + struct.pack(">I", DELTA.ByteSize()) + DELTA.SerializeToString()
    # Frames come out whole however the body is split.
    want_frames = [{"data": DELTA.SerializeToString().hex()}, {"data": DELTA2.SerializeToString().hex()},
                   {"data": ""}, {"trailers": {"grpc-status": "0", "grpc-message": "all%20good"}}]
    for parsed in out["bodies"]:
        assert parsed["frames"] == want_frames, parsed["size"]
        assert parsed["pending"] is False
    assert out["cutPending"] is True
    # A truncated varint, a truncated field (twice), a string field sent as
    # a varint, a group (wire type 3), a truncated varint in a sub-message.
    errors = out["malformed"]
    assert all(errors), errors
    assert "truncated varint" in errors[0] and "truncated field" in errors[1] and "truncated field" in errors[2]
    assert "wire type 0 where string" in errors[3] and "wire type 3" in errors[4], errors
    assert out["badUint"] and "not a uint" in out["badUint"]

    # Its Client against a live gRPC port (Node's fetch: no CORS involved).
    live = out["live"]
    assert [(m["id"], m["kind"]) for m in live["models"]] == [(QWEN, "generate")]
    assert live["stats"]["model"] == QWEN and live["stats"]["kvBlocksTotal"] > 0
    assert live["unknown"]["name"] == "GrpcError" and live["unknown"]["codeName"] == "NOT_FOUND", live["unknown"]
    assert "no-such-model" in live["unknown"]["message"]
    events = live["events"]
    finish = events[-1]["finish"]
    assert finish["reason"] == 2 and finish["usage"]["completionTokens"] == 4, events
    stub = pb_grpc.GenerationStub(grpc.insecure_channel(qwen.grpc))
    ref = list(stub.GenerateStream(pb.Request(text="The capital of France is", max_tokens=4,
                                              sampling=pb.SamplingParams(temperature=0)), timeout=60))
    assert "".join(e["delta"]["text"] for e in events if "delta" in e) == \
        "".join(e.delta.text for e in ref if e.HasField("delta"))
    assert [t for e in events if "delta" in e for t in e["delta"]["tokenIds"]] == \
        [t for e in ref if e.HasField("delta") for t in e.delta.token_ids]


# ---------------------------------------------------------------------------
# The routes and the gRPC port's CORS, without a browser


def grpc_web_call(server: harness.Server, method: str, message: bytes, origin: str) -> harness.HttpReply:
    return harness.http_request(server.grpc, "POST", f"/{method}", b"\x00" + struct.pack(">I", len(message)) + message,
                                {"Content-Type": "application/grpc-web+proto", "X-Grpc-Web": "1", "Origin": origin})


def preflight(server: harness.Server, origin: str) -> harness.HttpReply:
    return harness.http_request(server.grpc, "OPTIONS", "/gyre.v1.Generation/GenerateStream", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type,x-grpc-web,x-user-agent"})


def port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def test_the_page_is_served_and_the_grpc_port_grants_its_origin_only(qwen):
    page = harness.http_request(qwen.http, "GET", "/playground")
    assert page.status == 200 and page.headers["content-type"].startswith("text/html"), page
    assert b"<title>gyre playground</title>" in page.body
    config = harness.http_json(qwen.http, "/playground/config.json")
    assert config.json() == {"grpc": {"scheme": "http", "port": port(qwen.grpc)}, "key_required": False}

    own = f"http://127.0.0.1:{port(qwen.http)}"
    granted = preflight(qwen, own)
    assert 200 <= granted.status < 300 and granted.headers.get("access-control-allow-origin") == own, granted
    assert "x-grpc-web" in granted.headers["access-control-allow-headers"].lower()
    for other in [f"http://evil.example:{port(qwen.http)}", "http://127.0.0.1:1", f"https://127.0.0.1:{port(qwen.http)}"]:
        assert "access-control-allow-origin" not in preflight(qwen, other).headers, other

    reply = grpc_web_call(qwen, "gyre.v1.Generation/GetStats", pb.GetStatsRequest(model=QWEN).SerializeToString(), own)
    assert reply.status == 200 and reply.headers.get("access-control-allow-origin") == own, reply
    assert "grpc-status" in reply.headers["access-control-expose-headers"].lower()
    (length,) = struct.unpack(">I", reply.body[1:5])
    assert pb.EngineStats.FromString(reply.body[5:5 + length]).model == QWEN
    assert b"grpc-status:0" in reply.body[5 + length:].replace(b" ", b"")


def test_no_playground_is_a_404_and_leaves_the_grpc_port_without_cors(module_server):
    server = module_server(QWEN, "--no-playground")
    for path in ["/playground", "/playground/", "/playground/app.js", "/playground/config.json"]:
        reply = harness.http_request(server.http, "GET", path)
        assert reply.status == 404, (path, reply.status)
        assert reply.json()["error"]["code"] == "not_found"
    own = f"http://127.0.0.1:{port(server.http)}"
    assert "access-control-allow-origin" not in preflight(server, own).headers
    reply = grpc_web_call(server, "gyre.v1.Generation/GetStats", b"", own)
    assert reply.status == 200 and "access-control-allow-origin" not in reply.headers


def test_the_page_needs_no_key_and_passes_the_one_typed_in(module_server):
    server = module_server(QWEN, "--api-key", "sekret")
    assert harness.http_request(server.http, "GET", "/playground").status == 200
    assert harness.http_json(server.http, "/playground/config.json").json()["key_required"] is True
    assert harness.http_request(server.http, "GET", "/v1/models").status == 401
    own = f"http://127.0.0.1:{port(server.http)}"
    refused = grpc_web_call(server, "gyre.v1.Generation/ListModels", b"", own)
    # Trailers-only: the status is in the headers, which the page may read.
    assert refused.headers.get("grpc-status") == "16", refused.headers
    assert refused.headers.get("access-control-allow-origin") == own


# ---------------------------------------------------------------------------
# In the browser


@pytest.fixture(scope="module")
def smol():
    harness.require_file(DEFAULT_MODEL, "the default model SmolLM2-135M-Instruct (make models)")
    # No --model: the default model, as `gyre serve` alone serves it.
    server = harness.Server.start([str(harness.GYRE_BIN), "serve",
                                   "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"])
    yield server
    server.stop()
    assert "panicked" not in server.stderr(), server.stderr()[-4000:]
    server.remove_log()


@pytest.fixture(scope="module")
def browser_page():
    with browser_util.playwright_api()() as p:
        browser = browser_util.launch(p)
        page = browser.new_page(viewport={"width": 1280, "height": 860})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        yield page, errors
        browser.close()


def engine(stub) -> pb.EngineStats:
    return stub.GetStats(pb.GetStatsRequest(model=MODEL), timeout=10)


def wait_for(what: str, check, timeout: float = 30.0, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}", pytrace=False)
        time.sleep(every)


def page_wait(page, condition: str, timeout: float = 30.0):
    """Waits until the JavaScript expression `condition` is true in the page.
    Polled from here with `page.evaluate`, which the page's content security
    policy does not restrict (Playwright's own `wait_for_function` runs
    `eval` in the page, which that policy rightly refuses), so the page is
    tested under its real policy."""
    return wait_for(condition, lambda: page.evaluate(f"() => {condition}"), timeout)


def assert_png(path: Path) -> None:
    width, height = browser_util.png_size(path)
    assert width >= 1000 and height >= 600, (width, height)
    # A blank page compresses to a few KB; text, panels and a bar do not.
    size = path.stat().st_size
    assert size > 20_000, f"{path}: only {size} bytes"


# Records every text the output shows, and every value of the page's
# "Running" stat, as the page changes them.
OBSERVE = """() => {
  window.outputs = []; window.runningSeen = [];
  const out = document.getElementById('output'), run = document.getElementById('stat-running');
  new MutationObserver(() => window.outputs.push(out.textContent))
    .observe(out, {childList: true, characterData: true, subtree: true});
  new MutationObserver(() => window.runningSeen.push(run.textContent))
    .observe(run, {childList: true, characterData: true, subtree: true});
}"""


def test_the_page_streams_from_the_default_model_and_stops(browser_page, smol):
    page, errors = browser_page
    stub = pb_grpc.GenerationStub(grpc.insecure_channel(smol.grpc))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    page.goto(f"http://{smol.http}/playground")
    page_wait(page, f"document.querySelector('#model option[value=\"{MODEL}\"]') !== null")
    page.select_option("#model", MODEL)
    assert page.input_value("#grpc-url") == f"http://127.0.0.1:{port(smol.grpc)}"
    page_wait(page, "document.getElementById('stat-kv-total').textContent !== '–'")
    page.evaluate(OBSERVE)

    # 1. A greedy answer, streamed.
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "48")
    page.fill("#prompt", QUESTION)
    page.click("#send")
    page_wait(page, "document.getElementById('status').dataset.state !== 'running'", timeout=120)
    assert page.get_attribute("#status", "data-state") == "done", page.text_content("#status")
    answer = page.text_content("#output")
    ref = harness.http_json(smol.http, "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": QUESTION}], "temperature": 0, "max_tokens": 48})
    assert answer == ref.json()["choices"][0]["message"]["content"], (answer, ref.body)
    assert "Paris" in answer
    partial = [t for t in dict.fromkeys(page.evaluate("window.outputs")) if t and t != answer]
    assert len(partial) >= 2, f"the text did not stream: {partial!r}"
    for shorter, longer in zip(partial, [*partial[1:], answer]):
        assert longer.startswith(shorter) and len(longer) > len(shorter), (shorter, longer)
    assert re.fullmatch(r"\d+ ms", page.text_content("#ttft")), page.text_content("#ttft")
    assert float(page.text_content("#tps")) > 0, page.text_content("#tps")
    usage = ref.json()["usage"]["completion_tokens"]
    assert int(page.text_content("#tokens")) == usage
    reason = ref.json()["choices"][0]["finish_reason"]
    assert page.text_content("#status") == f"finished ({reason}) after {usage} tokens"
    page_wait(page, "document.getElementById('stat-running').textContent === '0'")
    page.screenshot(path=str(ARTIFACTS / "playground.png"), full_page=True)
    assert_png(ARTIFACTS / "playground.png")

    # 2. An endless generation, stopped from the page.
    idle = wait_for("the engine to be idle", lambda: (s := engine(stub)).running == 0 and s.waiting == 0 and s)
    idle_used = idle.kv_blocks_used
    page.check("#ignore-eos")
    page.fill("#max-tokens", "4000")
    page.fill("#temperature", "0.8")
    page.fill("#prompt", "Tell me a very long story about a dragon who learns to sail.")
    page.click("#send")
    wait_for("the engine to run the request", lambda: engine(stub).running == 1)
    page_wait(page, "parseInt(document.getElementById('tokens').textContent) >= 16", timeout=60)
    # The page's own engine panel sees it running (it polls every second).
    page_wait(page, "document.getElementById('stat-running').textContent === '1'", timeout=10)
    busy = engine(stub)
    assert busy.kv_blocks_used > idle_used, (busy, idle_used)
    stopped_at = time.monotonic()
    page.click("#stop")
    page_wait(page, "document.getElementById('status').dataset.state === 'stopped'", timeout=10)
    freed = wait_for("the engine to free the request's blocks",
                     lambda: (s := engine(stub)).running == 0 and s.waiting == 0 and s.kv_blocks_used == idle_used
                     and s, timeout=15)
    freed_after = time.monotonic() - stopped_at
    text = page.text_content("#output")
    time.sleep(1.5)
    later = engine(stub)
    assert later.generated_tokens_total == freed.generated_tokens_total, "tokens still being generated"
    generated = later.generated_tokens_total - idle.generated_tokens_total
    assert 16 <= generated < 4000, generated
    assert page.text_content("#output") == text and len(text) > 0, "the page kept growing after Stop"
    assert page.text_content("#status").startswith("stopped after "), page.text_content("#status")
    assert page.is_enabled("#send") and not page.is_enabled("#stop")
    page_wait(page, "document.getElementById('stat-running').textContent === '0'", timeout=10)
    assert page.text_content("#stat-kv-used") == str(idle_used)
    assert "1" in page.evaluate("window.runningSeen")
    page.screenshot(path=str(ARTIFACTS / "playground-stopped.png"), full_page=True)
    assert_png(ARTIFACTS / "playground-stopped.png")
    assert not errors, errors
    print(f"\nplayground: the engine was idle {freed_after:.2f}s after Stop, {generated} tokens generated; "
          f"screenshots in {ARTIFACTS}")
