"""The TypeScript client's browser entry (`gyre-client/web`, gRPC-Web over
fetch) in a real browser against a live gyre serving the real default model
(SmolLM2-135M-Instruct), from a user's own web page (issue 16).

- The package is built from a fresh copy (tests/ts_package.py); a small ESM
  app (`tests/web/typescript_client.mjs`) imports it by package name and is
  bundled for the browser with esbuild (npm, pinned in package.json,
  installed by `make node`). The bundle and `typescript_client.html` are
  served by Python's http.server on two loopback origins (ephemeral ports):
  one passed to gyre's `--cors-allow-origin`, one not.
- Headless Chromium (Debian's package, `make chromium`) driven by
  Playwright loads the page from the granted origin and runs each check
  there: greedy `generate` equals the HTTP API's completion, the pieces of
  `stream` join to it, aborting a stream's AbortSignal mid-stream ends it
  with Canceled and the engine lets the request go (GetStats, over gRPC
  from here: nothing running, the KV blocks back to their idle count, far
  fewer tokens generated than asked for), an unknown model is a
  ConnectError with code NotFound, and under `--api-key` calls without the
  key (or with a wrong one) are Unauthenticated and served with it.
- The same page from the other origin: the browser refuses the calls
  (CORS), and the server never sees them (no tokens generated).

Screenshots go to $GYRE_ARTIFACTS (default .gyre/artifacts). Chromium,
Playwright or esbuild missing fails the test, saying how to install it.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

import browser_util
import harness
import ts_package

sys.path.insert(0, str(harness.REPO / "clients" / "python"))
from gyre.v1 import generate_pb2 as pb  # noqa: E402
from gyre.v1 import generate_pb2_grpc as pb_grpc  # noqa: E402

WEB = harness.REPO / "tests" / "web"
ESBUILD = Path(os.environ.get("ESBUILD") or harness.REPO / "node_modules" / ".bin" / "esbuild").absolute()
ARTIFACTS = Path(os.environ.get("GYRE_ARTIFACTS") or harness.REPO / ".gyre" / "artifacts").absolute()
GGUF = "smollm2-135m-instruct.gguf"
MODEL = "smollm2-135m-instruct"
KEY = "browser-sekret"
PROMPT = "The capital of France is"
GREEDY = {"maxTokens": 16, "temperature": 0}
LONG = {"maxTokens": 4000, "ignoreEos": True}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A folder with the page (index.html) and its bundled app (app.js)."""
    if not ESBUILD.exists():
        pytest.fail(f"esbuild not found at {ESBUILD}: `make node` installs it (package.json)", pytrace=False)
    pkg = ts_package.build_fresh(tmp_path_factory.mktemp("clone"))
    app = ts_package.app_folder(tmp_path_factory.mktemp("app"), pkg)
    shutil.copy(WEB / "typescript_client.mjs", app / "main.mjs")
    site = tmp_path_factory.mktemp("site")
    done = subprocess.run([str(ESBUILD), "main.mjs", "--bundle", "--format=esm", "--platform=browser",
                           "--target=chrome110", f"--outfile={site / 'app.js'}", "--log-level=warning"],
                          cwd=app, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"esbuild:\n{done.stdout}\n{done.stderr}"
    shutil.copy(WEB / "typescript_client.html", site / "index.html")
    bundle = (site / "app.js").read_text(encoding="utf-8")
    # The web entry and its gRPC-Web transport, and nothing of Node's.
    assert "application/grpc-web" in bundle and "gyre.v1.Generation" in bundle
    for node_only in ("connect-node", "node:http2", "require(\"http2\")"):
        assert node_only not in bundle, node_only
    return site


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # noqa: D102 - keep the test output clean
        pass


@pytest.fixture(scope="module")
def origins(site):
    """Two static servers of `site` on loopback (ephemeral ports): their origins."""
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
               for _ in range(2)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    yield [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
    for s in servers:
        s.shutdown()
        s.server_close()


@pytest.fixture(scope="module")
def smol(module_server, origins) -> harness.Server:
    granted, _ = origins
    return module_server(GGUF, "--api-key", KEY, "--cors-allow-origin", granted)


@pytest.fixture(scope="module")
def browser():
    with browser_util.playwright_api()() as p:
        b = browser_util.launch(p)
        yield b
        b.close()


def open_page(browser, origin: str):
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    console: list[str] = []
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
    page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
    page.goto(f"{origin}/index.html")
    page.wait_for_function("typeof window.gyreCheck === 'function'", timeout=30_000)
    assert page.text_content("#origin") == origin
    return page, console


@pytest.fixture(scope="module")
def granted_page(browser, origins):
    page, console = open_page(browser, origins[0])
    yield page, console
    page.close()


def check(page, smol: harness.Server, name: str, **args) -> dict:
    return page.evaluate("([name, args]) => window.gyreCheck(name, args)",
                         [name, {"baseUrl": f"http://{smol.grpc}", "apiKey": KEY, **args}])


def stub(smol: harness.Server):
    return pb_grpc.GenerationStub(grpc.insecure_channel(smol.grpc))


def engine(smol: harness.Server) -> pb.EngineStats:
    return stub(smol).GetStats(pb.GetStatsRequest(model=MODEL), timeout=10,
                               metadata=[("authorization", f"Bearer {KEY}")])


def wait_for(what: str, condition, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}", pytrace=False)
        time.sleep(0.05)
    return value


def http_completion(smol: harness.Server) -> dict:
    r = harness.http_json(smol.http, "/v1/completions",
                          {"model": MODEL, "prompt": PROMPT, "max_tokens": 16, "temperature": 0},
                          headers={"Authorization": f"Bearer {KEY}"})
    assert r.status == 200, r.body
    return r.json()


def test_generate_greedy_equals_the_http_api(granted_page, smol):
    page, console = granted_page
    ref = http_completion(smol)
    choice = ref["choices"][0]
    c = check(page, smol, "generate", prompt=PROMPT, options=GREEDY)["completion"]
    assert c["text"] == choice["text"] and c["text"].strip(), (c, choice)
    assert c["finishReason"] == choice["finish_reason"]
    assert [c["usage"]["promptTokens"], c["usage"]["completionTokens"]] == \
        [ref["usage"]["prompt_tokens"], ref["usage"]["completion_tokens"]]
    assert len(c["tokenIds"]) == c["usage"]["completionTokens"]
    assert c["model"] == MODEL and c["requestId"], c
    assert not console, console


def test_stream_pieces_join_to_the_generated_text(granted_page, smol):
    page, console = granted_page
    ref = http_completion(smol)["choices"][0]["text"]
    whole = check(page, smol, "generate", prompt=PROMPT, options=GREEDY)["completion"]
    out = check(page, smol, "stream", prompt=PROMPT, options=GREEDY)
    pieces = out["pieces"]
    assert len(pieces) > 1, pieces
    assert "".join(p["text"] for p in pieces) == whole["text"] == ref
    assert [t for p in pieces for t in p["tokenIds"]] == whole["tokenIds"]
    assert out["completion"]["text"] == ref
    assert out["completion"]["finishReason"] == whole["finishReason"]
    assert out["completion"]["usage"]["completionTokens"] == whole["usage"]["completionTokens"]
    assert not console, console


def test_aborting_a_stream_ends_it_and_frees_the_request(granted_page, smol):
    page, console = granted_page
    idle = wait_for("the engine to be idle", lambda: (s := engine(smol)).running == 0 and s.waiting == 0 and s)
    out = check(page, smol, "abort", prompt="Story:", options=LONG, model=MODEL, afterPieces=4)
    # It was running when aborted, and ended there: Canceled, no completion.
    assert out["runningBefore"] >= 1 and out["pieces"] == 4, out
    assert out["ended"] == "error" and out["error"]["code"] == "Canceled", out
    assert out["completion"] is None, out
    freed = wait_for("the engine to let the request go",
                     lambda: (s := engine(smol)).running == 0 and s.waiting == 0
                     and s.kv_blocks_used == idle.kv_blocks_used and s, timeout=15)
    generated = freed.generated_tokens_total - idle.generated_tokens_total
    assert out["tokens"] <= generated < LONG["maxTokens"], (out, generated)
    assert not console, console


def test_an_unknown_model_is_not_found(granted_page, smol):
    page, console = granted_page
    out = check(page, smol, "unknown-model")
    for call in ("generate", "stats"):
        assert out[call].get("error", {}).get("code") == "NotFound", (call, out[call])
    assert "no-such-model" in out["generate"]["error"]["rawMessage"], out
    assert not console, console


def test_the_api_key_is_required_and_accepted(granted_page, smol):
    page, console = granted_page
    out = check(page, smol, "auth", key=KEY)
    assert out["none"].get("error", {}).get("code") == "Unauthenticated", out["none"]
    assert out["wrong"].get("error", {}).get("code") == "Unauthenticated", out["wrong"]
    assert MODEL in [m["id"] for m in out["right"]["ok"]], out["right"]
    assert out["generate"]["ok"]["usage"]["completionTokens"] == 3, out["generate"]
    assert not console, console
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "typescript-browser.png"
    page.screenshot(path=str(shot), full_page=True)
    assert browser_util.png_size(shot)[0] >= 1000


def test_a_page_of_another_origin_is_refused_by_the_browser(browser, origins, smol):
    _, other = origins
    page, console = open_page(browser, other)
    before = engine(smol)
    out = check(page, smol, "refused", prompt=PROMPT)
    # The browser ends each call before the app sees an answer (a fetch
    # TypeError, as a ConnectError), and says why on its console.
    for call in ("models", "generate"):
        error = out[call].get("error", {})
        assert error.get("code") not in (None, "NotFound", "Unauthenticated"), (call, out[call])
        assert "fetch" in error.get("rawMessage", "").lower(), (call, out[call])
    blocked = [m for m in console if "blocked by CORS policy" in m]
    assert blocked and all(other in m for m in blocked), console
    # Refused at the preflight: the generation never reached the engine.
    after = engine(smol)
    assert after.generated_tokens_total == before.generated_tokens_total
    assert after.prefix_query_tokens_total == before.prefix_query_tokens_total
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "typescript-browser-refused.png"
    page.screenshot(path=str(shot), full_page=True)
    assert browser_util.png_size(shot)[0] >= 1000
    page.close()
