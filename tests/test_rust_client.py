"""The Rust client (`gyre_api::client`) through its examples, against a live
gyre: the example binaries (`generate`, `chat`, `bidi`, `tokenize`) that
`make test-e2e` builds beforehand (`cargo build --release --examples -p
gyre-api`) and names with GYRE_EXAMPLES_DIR (default: the `examples` folder
beside GYRE_BIN). Nothing is built here.

On the real default model (SmolLM2-135M-Instruct): the streamed greedy
text of `generate` equals the HTTP API's answer to the same request; `chat`
equals the HTTP chat completion; `bidi` multiplexes two requests on one
`Generate` stream, cancels one (it finishes CANCELLED) and the other
completes with the greedy answer; `tokenize` agrees with the HTTP
`/tokenize` and decodes back to the text. A server with `--api-key` refuses
the examples without the key (UNAUTHENTICATED, printed from the typed
error) and serves them with it. Over TLS with a client certificate (mTLS,
certificates made here with openssl) the examples connect with the CA,
the certificate and the key, verify a name given with GYRE_TLS_DOMAIN, and
are refused without the client certificate, with the wrong name, and
without TLS.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

import harness
from conftest import API_KEY, QWEN, assert_no_panic

EXAMPLES = harness._env_path("GYRE_EXAMPLES_DIR", harness.GYRE_BIN.parent / "examples")
GGUF = "smollm2-135m-instruct.gguf"
MODEL = "smollm2-135m-instruct"
PROMPT = "The capital of France is"
QUESTION = "What is the capital of France?"
FINISH = re.compile(r"^finish: (\w+), (\d+) prompt \+ (\d+) completion tokens, model (\S+)$", re.M)
BIDI_LINE = re.compile(r"^(\S+): (\w+) after (\d+) tokens: (\".*\")$")
# Connection settings of the examples that a test sets itself: never
# inherited from the environment running the tests.
CLIENT_ENV = ("GYRE_URL", "GYRE_API_KEY", "GYRE_CA_CERT", "GYRE_CLIENT_CERT", "GYRE_CLIENT_KEY",
              "GYRE_TLS_DOMAIN")


def example(name: str, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    """Runs the built example `name` with `args` and the connection
    settings `env` (GYRE_URL=..., ...)."""
    binary = harness.require_file(EXAMPLES / name, f"Rust client example {name!r} (GYRE_EXAMPLES_DIR; "
                                                   "`cargo build --release --examples -p gyre-api`)")
    base = {k: v for k, v in os.environ.items() if k not in CLIENT_ENV}
    return subprocess.run([str(binary), *args], env={**base, **env}, capture_output=True, text=True,
                          timeout=timeout)


def ok(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, f"{done.args} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


def refused(done: subprocess.CompletedProcess) -> str:
    """The error line of an example that failed (and printed nothing else)."""
    assert done.returncode == 1, f"{done.args} did not fail:\n{done.stdout}\n{done.stderr}"
    assert "panicked" not in done.stderr, done.stderr
    assert done.stderr.startswith("error: "), done.stderr
    return done.stderr


def finish(done: subprocess.CompletedProcess) -> tuple[str, int, int, str]:
    m = FINISH.search(done.stderr)
    assert m, done.stderr
    return m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)


@pytest.fixture(scope="module")
def smol(module_server) -> harness.Server:
    return module_server(GGUF)


def url(server: harness.Server) -> str:
    return f"{server.scheme}://{server.grpc}"


def http_completion(server: harness.Server, **body) -> dict:
    r = harness.http_json(server.http, "/v1/completions", {"model": MODEL, "temperature": 0, **body})
    assert r.status == 200, r.body
    return r.json()


def test_generate_streams_the_greedy_answer_of_the_http_api(smol):
    done = ok(example("generate", PROMPT, "16", GYRE_URL=url(smol)))
    ref = http_completion(smol, prompt=PROMPT, max_tokens=16)
    choice = ref["choices"][0]
    # The example ends the streamed text with one newline.
    assert done.stdout == choice["text"] + "\n"
    assert choice["text"].strip()
    assert finish(done) == (choice["finish_reason"], ref["usage"]["prompt_tokens"],
                            ref["usage"]["completion_tokens"], MODEL)


def test_chat_equals_the_http_chat_completion(smol):
    done = ok(example("chat", QUESTION, GYRE_URL=url(smol)))
    messages = [{"role": "user", "content": QUESTION}]
    ref = harness.http_json(smol.http, "/v1/chat/completions",
                            {"model": MODEL, "messages": messages, "max_tokens": 64, "temperature": 0})
    assert ref.status == 200, ref.body
    answer = ref.json()["choices"][0]["message"]["content"]
    assert done.stdout == answer + "\n"
    assert "Paris" in answer
    usage = ref.json()["usage"]
    assert finish(done) == (ref.json()["choices"][0]["finish_reason"], usage["prompt_tokens"],
                            usage["completion_tokens"], MODEL)
    # With a system message (the second argument) first.
    with_system = ok(example("chat", QUESTION, "You are terse.", GYRE_URL=url(smol)))
    ref = harness.http_json(smol.http, "/v1/chat/completions",
                            {"model": MODEL, "max_tokens": 64, "temperature": 0,
                             "messages": [{"role": "system", "content": "You are terse."}, *messages]})
    assert ref.status == 200, ref.body
    assert with_system.stdout == ref.json()["choices"][0]["message"]["content"] + "\n"
    assert finish(with_system)[1] == ref.json()["usage"]["prompt_tokens"] != usage["prompt_tokens"]


def bidi_lines(done: subprocess.CompletedProcess) -> list[tuple[str, str, int, str]]:
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stdout
    out = []
    for line in lines:
        m = BIDI_LINE.match(line)
        assert m, line
        out.append((m.group(1), m.group(2), int(m.group(3)), rust_debug_str(m.group(4))))
    return out


def rust_debug_str(quoted: str) -> str:
    """A string as Rust's `{:?}` prints it (Python's escapes, except that a
    Unicode escape is `\\u{e31}`, which Python's parser refuses)."""
    def escape(m: re.Match) -> str:
        return m.group(0) if m.group(1) is None else f"\\U{int(m.group(1), 16):08x}"

    # An escaped backslash is matched whole, so `\\\\u{41}` stays text.
    python = re.sub(r"\\\\|\\u\{([0-9a-fA-F]{1,6})\}", escape, quoted)
    return ast.literal_eval(python)


def test_bidi_multiplexes_two_requests_and_cancels_one(smol):
    done = ok(example("bidi", GYRE_URL=url(smol)))
    (short_id, short_reason, short_n, short_text), (long_id, long_reason, long_n, long_text) = bidi_lines(done)
    assert short_id != long_id
    ref = http_completion(smol, prompt="One, two, three,", max_tokens=10)
    assert (short_reason, short_n, short_text) == ("length", 10, ref["choices"][0]["text"])
    assert long_reason == "cancelled"
    assert 1 <= long_n < 1000
    assert long_text  # its first delta arrived before the cancel went out


def test_tokenize_agrees_with_the_http_tokenize(smol):
    done = ok(example("tokenize", PROMPT, GYRE_URL=url(smol)))
    fields = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    assert fields["health"] == "Serving"
    assert fields["models"] == MODEL
    ref = harness.http_json(smol.http, "/tokenize", {"model": MODEL, "prompt": PROMPT})
    assert ref.status == 200, ref.body
    assert json.loads(fields["token_ids"]) == ref.json()["tokens"]
    assert int(fields["max_model_len"]) == ref.json()["max_model_len"]
    assert rust_debug_str(fields["detokenized"]) == PROMPT


def test_a_bad_url_is_a_clear_error_not_a_panic(smol):
    assert "https" in refused(example("tokenize", GYRE_URL=f"https://{smol.grpc}"))
    assert "bad server URL" in refused(example("tokenize", GYRE_URL="http://no such host"))
    assert "printable ASCII" in refused(example("tokenize", GYRE_URL=url(smol), GYRE_API_KEY="clé"))


def test_api_key(keyed):
    for env in ({}, {"GYRE_API_KEY": "not-the-key"}):
        for name in ("tokenize", "generate", "bidi"):
            err = refused(example(name, GYRE_URL=url(keyed), **env))
            assert err.startswith("error: UNAUTHENTICATED"), err
    done = ok(example("tokenize", GYRE_URL=url(keyed), GYRE_API_KEY=API_KEY))
    assert f"models: {QWEN}\n" in done.stdout
    assert finish(ok(example("generate", "Hi", "3", GYRE_URL=url(keyed), GYRE_API_KEY=API_KEY)))[2] >= 1
    [short, long] = bidi_lines(ok(example("bidi", GYRE_URL=url(keyed), GYRE_API_KEY=API_KEY)))
    assert long[1] == "cancelled" and short[1] in ("length", "stop")


def openssl(cwd: Path, *args: str) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"openssl {' '.join(args)}: {done.stderr}"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """A server CA and a client CA (self-signed), a server leaf for 127.0.0.1
    and the name gyre.test, and a client leaf."""
    d = tmp_path_factory.mktemp("pki")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    for ca in ("server-ca", "client-ca"):
        openssl(d, "req", "-x509", *ec, "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "2",
                "-subj", f"/CN=gyre rust client test {ca}", "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign")
    for leaf, ca, ext in (("server", "server-ca",
                           "subjectAltName=IP:127.0.0.1,DNS:gyre.test\nextendedKeyUsage=serverAuth\n"),
                          ("client", "client-ca", "extendedKeyUsage=clientAuth\n")):
        openssl(d, "req", *ec, "-keyout", f"{leaf}.key", "-out", f"{leaf}.csr", "-subj", f"/CN={leaf}")
        (d / f"{leaf}.ext").write_text("basicConstraints=CA:FALSE\n" + ext)
        openssl(d, "x509", "-req", "-in", f"{leaf}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
                "-CAcreateserial", "-out", f"{leaf}.pem", "-days", "2", "-extfile", f"{leaf}.ext")
    return d


def test_tls_with_a_client_certificate(module_server, pki):
    server = module_server(QWEN, "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"),
                           "--tls-client-ca", str(pki / "client-ca.pem"))
    assert server.scheme == "https"
    mtls = {"GYRE_URL": url(server), "GYRE_CA_CERT": str(pki / "server-ca.pem"),
            "GYRE_CLIENT_CERT": str(pki / "client.pem"), "GYRE_CLIENT_KEY": str(pki / "client.key")}
    done = ok(example("tokenize", **mtls))
    assert f"models: {QWEN}\n" in done.stdout
    assert finish(ok(example("generate", "Hi", "3", **mtls)))[2] >= 1
    [short, long] = bidi_lines(ok(example("bidi", **mtls)))
    assert long[1] == "cancelled" and short[1] in ("length", "stop")
    # host:port alone is https when a CA is given; the name to verify can be
    # set apart from the address (the certificate names gyre.test).
    ok(example("tokenize", **{**mtls, "GYRE_URL": server.grpc, "GYRE_TLS_DOMAIN": "gyre.test"}))
    assert 'not valid for name "other.test"' in refused(example("tokenize", **{**mtls, "GYRE_TLS_DOMAIN": "other.test"}))
    # With the wrong CA, without a client certificate (the server closes the
    # connection: how the client sees that depends on timing), and without TLS.
    assert "UnknownIssuer" in refused(example("tokenize", **{**mtls, "GYRE_CA_CERT": str(pki / "client-ca.pem")}))
    refused(example("tokenize", GYRE_URL=url(server), GYRE_CA_CERT=str(pki / "server-ca.pem")))
    refused(example("tokenize", GYRE_URL=f"http://{server.grpc}"))
    # A client certificate without a CA is a settings error.
    err = refused(example("tokenize", GYRE_URL=url(server), GYRE_CLIENT_CERT=str(pki / "client.pem"),
                          GYRE_CLIENT_KEY=str(pki / "client.key")))
    assert "GYRE_CA_CERT" in err
    assert_no_panic(server)


def test_the_server_survived(smol):
    assert smol.alive()
    assert_no_panic(smol)
