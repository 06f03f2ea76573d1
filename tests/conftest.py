"""Shared fixtures of gyre's end-to-end tests.

Servers are real `gyre serve` processes on ephemeral loopback ports, started
once per session per model (see `harness.Server`) and stopped with SIGTERM at
the end; a server whose stderr shows a Rust panic fails the session teardown.

Environment (set by `make test-e2e`; defaults in parentheses):
GYRE_BIN (~/.cache/gyre/target/release/gyre), GYRE_SHIM_BIN (gyre-shim beside
it), GYRE_MODELS (.gyre/models), BUF (node_modules/.bin/buf), OPENAI_SPEC
(tests/data/openai/openapi.yaml).
"""

from __future__ import annotations

import pytest

import harness

QWEN = "tiny-qwen2"
MODELS = ("tiny-qwen2", "tiny-llama", "tiny-mistral")


def assert_no_panic(server: harness.Server) -> None:
    log = server.stderr()
    assert "panicked" not in log, f"{' '.join(server.argv)} panicked; stderr:\n{log[-4000:]}"


@pytest.fixture(scope="session")
def start_server():
    """Factory: `start_server(model, *flags)` -> a running `gyre serve`, stopped at session end."""
    started: list[harness.Server] = []

    def start(model: str, *flags: str) -> harness.Server:
        server = harness.serve(model, *flags)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
    panics = [s for s in started if "panicked" in s.stderr()]
    messages = [f"{' '.join(s.argv)} panicked; stderr:\n{s.stderr()[-4000:]}" for s in panics]
    for server in started:
        server.remove_log()
    assert not messages, "\n\n".join(messages)


@pytest.fixture(scope="module")
def module_server():
    """Factory like `start_server`, but its servers stop when the module's
    tests are done: a suite of many modules each with servers of their own
    would otherwise hold all of them (and their KV caches) until the end."""
    started: list[harness.Server] = []

    def start(model: str, *flags: str) -> harness.Server:
        server = harness.serve(model, *flags)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
    messages = [f"{' '.join(s.argv)} panicked; stderr:\n{s.stderr()[-4000:]}"
                for s in started if "panicked" in s.stderr()]
    for server in started:
        server.remove_log()
    assert not messages, "\n\n".join(messages)


@pytest.fixture(scope="session")
def model_server(start_server):
    """Factory: the shared (key-less) server of a model, started on first use."""
    cache: dict[str, harness.Server] = {}

    def get(model: str) -> harness.Server:
        if model not in cache:
            cache[model] = start_server(model)
        server = cache[model]
        assert server.alive(), f"the {model} server died; stderr:\n{server.stderr()[-4000:]}"
        return server

    return get


@pytest.fixture(scope="session")
def default_server() -> harness.Server:
    """`gyre serve` with no model argument: the real default model
    (SmolLM2-135M-Instruct), as a user's first command serves it. Shared by
    the modules that test that model through the tools users run."""
    harness.require_file(harness.MODELS / "smollm2-135m-instruct.gguf",
                         "the default model SmolLM2-135M-Instruct (make models)")
    server = harness.Server.start([str(harness.GYRE_BIN), "serve",
                                   "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"])
    yield server
    server.stop()
    log = server.stderr()
    server.remove_log()
    assert "panicked" not in log, f"the default model's server panicked; stderr:\n{log[-4000:]}"


@pytest.fixture(scope="session")
def qwen(model_server) -> harness.Server:
    """The shared `gyre serve` of tiny-qwen2 (both gRPC and HTTP)."""
    return model_server(QWEN)


API_KEY = "sekret"


@pytest.fixture(scope="session")
def keyed(start_server) -> harness.Server:
    """A tiny-qwen2 server started with `--api-key sekret`."""
    return start_server(QWEN, "--api-key", API_KEY)


@pytest.fixture(scope="session")
def client(qwen):
    """The official OpenAI SDK pointed at the shared tiny-qwen2 server."""
    import openai

    return openai.OpenAI(base_url=f"http://{qwen.http}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def tokenize(qwen):
    """Token ids of text or chat messages, through gRPC `Tokenize` (buf curl)."""

    def run(*, text: str | None = None, messages: list[dict] | None = None) -> list[int]:
        body: dict = {"model": QWEN}
        if text is not None:
            body["text"] = text
        else:
            body["chat"] = {"messages": messages}
        res = harness.buf_curl(qwen.grpc, "gyre.v1.Generation/Tokenize", body).ok()
        return [int(t) for t in res.messages[0].get("tokenIds", [])]

    return run
