"""The command line's conveniences: `gyre models`, `gyre chat` (against a
server over gRPC and HTTP, and on a model directory in-process), `gyre bench`
passing through to gyre-bench, the config file's flags and their precedence
(flag > environment > file > default), and `--help` grouped by topic.

Replies are checked against the OpenAI SDK asking the same server the same
conversation greedily (temperature 0): a `gyre chat` turn must produce
exactly the SDK's text, and its second turn exactly the SDK's answer to the
two-turn history; the server's request log (`--log-prompts`) shows that the
second request carried the first turn.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time

import openai
import pytest

import harness
from conftest import QWEN, assert_no_panic

ALIAS = "cli-alias"
MAX_TOKENS = 8
Q1 = "First question, marker kumquat."
Q2 = "Second question, marker persimmon."


@pytest.fixture(scope="module")
def server():
    qwen = harness.model_dir(QWEN)
    server = harness.Server.start([
        str(harness.GYRE_BIN), "serve", "--model", f"{qwen},alias={ALIAS}",
        "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--kv-cache-mib", "32",
        "--log-format", "json", "--log-prompts"])
    yield server
    server.stop()
    assert_no_panic(server)
    server.remove_log()


@pytest.fixture(scope="module")
def sdk(server):
    return openai.OpenAI(base_url=f"http://{server.http}/v1", api_key="unused", max_retries=0, timeout=120)


def gyre(*args: str, stdin: bytes | None = None, env: dict | None = None, timeout: float = 120,
         binary=None) -> subprocess.CompletedProcess:
    """Runs the gyre binary; stdout and stderr as bytes."""
    argv = [str(binary or harness.GYRE_BIN), *args]
    p = subprocess.run(argv, input=stdin if stdin is not None else b"", capture_output=True,
                       timeout=timeout, env=env, cwd=harness.REPO)
    assert b"panicked" not in p.stderr, p.stderr.decode(errors="replace")
    return p


def answer(sdk, messages: list[dict]) -> str:
    r = sdk.chat.completions.create(model=QWEN, messages=messages, temperature=0, max_tokens=MAX_TOKENS)
    return r.choices[0].message.content or ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request_prompts(server: harness.Server) -> list[str]:
    """The prompts of the finished GenerateStream requests, in order."""
    prompts = []
    for line in server.stderr().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        fields = event.get("fields", {})
        if event.get("target") == "gyre::request" and fields.get("method", "").endswith("GenerateStream"):
            prompts.append(fields.get("prompt", ""))
    return prompts


# ---------------------------------------------------------------------------
# gyre models


def test_models_lists_the_catalogue_as_a_table_and_as_json(server):
    catalogue = harness.http_json(server.http, "/v1/models").json()["data"]
    assert [m["id"] for m in catalogue] == [QWEN]

    p = gyre("models", "--grpc", f"http://{server.grpc}")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.decode().splitlines()
    assert lines[0].split() == ["ID", "OWNED", "BY", "CONTEXT", "KIND", "CHAT", "ALIASES", "VERSION"]
    assert len(lines) == 2
    row = lines[1].split()
    assert row == [QWEN, "gyre", str(catalogue[0]["max_model_len"]), "generate", "yes", ALIAS], row

    # JSON over HTTP is the API's own listing; over gRPC the same objects,
    # plus what only gRPC tells.
    over_http = json.loads(gyre("models", "--url", f"http://{server.http}", "--json").stdout)
    assert over_http == catalogue
    p = gyre("models", "--grpc", server.grpc, "--json")  # no scheme: http://
    assert p.returncode == 0, p.stderr
    over_grpc = json.loads(p.stdout)
    assert [m.pop("architecture") for m in over_grpc] == ["Qwen2ForCausalLM"]
    assert all(m.pop("vocab_size") > 0 for m in over_grpc)
    assert over_grpc == catalogue
    # The table over HTTP (a base URL ending in /v1 is fine) is the same.
    table = gyre("models", "--grpc", f"http://{server.grpc}").stdout
    assert gyre("models", "--url", f"http://{server.http}/v1").stdout == table


@pytest.mark.parametrize("flag,scheme", [("--grpc", "http"), ("--url", "http")])
def test_models_without_a_server_is_a_one_line_error(flag, scheme):
    p = gyre("models", flag, f"{scheme}://127.0.0.1:{free_port()}")
    assert p.returncode == 1, p
    err = p.stderr.decode().strip()
    assert len(err.splitlines()) == 1, err
    assert "cannot connect" in err and "127.0.0.1" in err, err
    assert p.stdout == b""


def _openssl(cwd, *args: str) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, f"openssl {' '.join(args)}: {done.stderr}"


def test_models_and_chat_over_grpc_with_tls(tmp_path):
    """--tls-ca: the CA an https:// gRPC address's certificate chains to
    (a CA and a server leaf made here with openssl)."""
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    for ca in ["ca", "other-ca"]:
        _openssl(tmp_path, "req", "-x509", *key, "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "2",
                 "-subj", f"/CN=gyre cli test {ca}", "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    _openssl(tmp_path, "req", *key, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=server")
    (tmp_path / "server.ext").write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                                         "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _openssl(tmp_path, "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "server.ext")
    server = harness.Server.start([
        str(harness.GYRE_BIN), "grpc", "--model", str(harness.model_dir(QWEN)), "--grpc-addr", "127.0.0.1:0",
        "--kv-cache-mib", "16", "--tls-cert", str(tmp_path / "server.pem"),
        "--tls-key", str(tmp_path / "server.key")], want=("gRPC",))
    try:
        assert server.scheme == "https"
        url = f"https://{server.grpc}"
        p = gyre("models", "--grpc", url, "--tls-ca", str(tmp_path / "ca.pem"), "--json")
        assert p.returncode == 0, p.stderr
        assert [m["id"] for m in json.loads(p.stdout)] == [QWEN]
        p = gyre("chat", "--grpc", url, "--tls-ca", str(tmp_path / "ca.pem"), "--max-tokens", "3",
                 stdin=b"Hi\n")
        assert p.returncode == 0 and p.stdout.endswith(b"\n") and len(p.stdout) > 1, p
        p = gyre("models", "--grpc", url)
        assert p.returncode == 1 and b"--tls-ca" in p.stderr, p.stderr
        p = gyre("models", "--grpc", url, "--tls-ca", str(tmp_path / "other-ca.pem"))
        assert p.returncode == 1 and b"cannot connect" in p.stderr, p.stderr
    finally:
        server.stop()
        assert_no_panic(server)
        server.remove_log()


# ---------------------------------------------------------------------------
# gyre chat


def test_chat_over_grpc_streams_each_turn_with_the_history(server, sdk):
    before = len(request_prompts(server))
    p = gyre("chat", "--grpc", f"http://{server.grpc}", "--temperature", "0", "--max-tokens", str(MAX_TOKENS),
             stdin=f"{Q1}\n{Q2}\n".encode())
    assert p.returncode == 0, p.stderr
    # The server saw two requests: the second carried the first turn.
    deadline = time.monotonic() + 15
    while len(request_prompts(server)) < before + 2:
        assert time.monotonic() < deadline, server.stderr()[-3000:]
        time.sleep(0.05)
    first, second = request_prompts(server)[before:before + 2]
    assert Q1 in first and Q2 not in first, first
    assert Q1 in second and Q2 in second and second.index(Q1) < second.index(Q2), second

    r1 = answer(sdk, [{"role": "user", "content": Q1}])
    r2 = answer(sdk, [{"role": "user", "content": Q1}, {"role": "assistant", "content": r1},
                      {"role": "user", "content": Q2}])
    assert p.stdout.decode() == f"{r1}\n{r2}\n"
    # Piped input gets no prompt or banner on stdout.
    assert b"> " not in p.stdout[:2]


def test_chat_over_http_gives_the_same_replies(server, sdk):
    p = gyre("chat", "--url", f"http://{server.http}", "--model", ALIAS, "--temperature", "0",
             "--max-tokens", str(MAX_TOKENS), stdin=f"{Q1}\n{Q2}\n".encode())
    assert p.returncode == 0, p.stderr
    r1 = answer(sdk, [{"role": "user", "content": Q1}])
    r2 = answer(sdk, [{"role": "user", "content": Q1}, {"role": "assistant", "content": r1},
                      {"role": "user", "content": Q2}])
    assert p.stdout.decode() == f"{r1}\n{r2}\n"


def test_chat_reset_system_and_exit(server, sdk):
    system = "You answer tersely."
    r1 = answer(sdk, [{"role": "system", "content": system}, {"role": "user", "content": Q1}])
    # /reset forgets the first turn (the system message stays): the same
    # question gets the same answer; /exit ends before the last line.
    p = gyre("chat", "--grpc", f"http://{server.grpc}", "--system", system, "--temperature", "0",
             "--max-tokens", str(MAX_TOKENS), stdin=f"{Q1}\n/reset\n\n{Q1}\n/exit\n{Q2}\n".encode())
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode() == f"{r1}\n{r1}\n"
    # An unknown command is not sent.
    p = gyre("chat", "--grpc", f"http://{server.grpc}", stdin=b"/nope\n")
    assert p.returncode == 0 and p.stdout == b"", p
    assert b"unknown command /nope" in p.stderr


def test_chat_errors_are_clear(server):
    p = gyre("chat", "--grpc", f"http://{server.grpc}", "--model", "no-such-model", stdin=b"Hi\n")
    assert p.returncode == 1 and p.stdout == b""
    assert f"no model `no-such-model` here (models: {QWEN})".encode() in p.stderr, p.stderr
    p = gyre("chat", "--grpc", f"http://127.0.0.1:{free_port()}", stdin=b"Hi\n")
    assert p.returncode == 1 and b"cannot connect" in p.stderr, p.stderr
    # A turn the server refuses is reported on stderr, and the exit status
    # says one failed.
    p = gyre("chat", "--grpc", f"http://{server.grpc}", "--temperature", "5", "--max-tokens", "2",
             stdin=b"Hi\n")
    assert p.returncode == 1, p
    assert b"error:" in p.stderr and b"temperature" in p.stderr, p.stderr


def metric(server: harness.Server, name: str, label: str = "") -> float:
    """The sum of a metric's samples on /metrics (those whose labels contain
    `label`)."""
    text = harness.http_request(server.http, "GET", "/metrics").body.decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            labels, _, value = line.rpartition(" ")
            if label in labels:
                total += float(value)
    return total


def test_ctrl_c_stops_the_reply_not_the_chat(server):
    """SIGINT mid-reply cancels the stream (the engine aborts the request
    far short of --max-tokens) and the chat goes on to read the next line."""
    limit = 1500
    aborted = metric(server, "gyre:request_success_total", 'finished_reason="abort"')
    generated = metric(server, "gyre:generation_tokens_total")
    proc = subprocess.Popen(
        [str(harness.GYRE_BIN), "chat", "--grpc", f"http://{server.grpc}", "--temperature", "1", "--seed", "7",
         "--max-tokens", str(limit)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        proc.stdin.write(b"Go on forever.\n")
        proc.stdin.flush()
        got = b""
        while len(got) < 40:
            chunk = os.read(proc.stdout.fileno(), 4096)
            assert chunk, f"the reply ended before Ctrl-C: {got!r}"
            got += chunk
        proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 60
        while (metric(server, "gyre:request_success_total", 'finished_reason="abort"') < aborted + 1
               or metric(server, "gyre:num_requests_running") > 0):
            assert time.monotonic() < deadline, "the request was not aborted"
            time.sleep(0.05)
        made = metric(server, "gyre:generation_tokens_total") - generated
        assert made < limit // 2, f"{made} tokens generated after Ctrl-C (uncancelled: {limit})"
        assert proc.poll() is None, "Ctrl-C during a reply ended the chat"
        out, err = proc.communicate(b"/exit\n", timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err
    assert b"(reply stopped)" in err, err
    assert b"panicked" not in err
    # What came before the Ctrl-C was printed, then the line was ended.
    assert (got + out).endswith(b"\n") and len(got + out) >= 40


def test_chat_on_a_model_directory_needs_no_server(server, sdk):
    r1 = answer(sdk, [{"role": "user", "content": Q1}])
    p = gyre("chat", "--model-dir", str(harness.model_dir(QWEN)), "--device", "cpu", "--temperature", "0",
             "--max-tokens", str(MAX_TOKENS), stdin=f"{Q1}\n".encode())
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode() == f"{r1}\n"
    # `--local` is the same flag; a path that is not a model fails clearly.
    p = gyre("chat", "--local", "/no/such/model", stdin=b"Hi\n")
    assert p.returncode == 1 and b"/no/such/model" in p.stderr, p.stderr


# ---------------------------------------------------------------------------
# gyre bench


def test_bench_passes_everything_through():
    bench = harness.require_file(harness.GYRE_BIN.parent / "gyre-bench", "gyre-bench beside gyre")
    direct = subprocess.run([str(bench), "--help"], capture_output=True, timeout=60)
    p = gyre("bench", "--help")
    assert p.returncode == 0 and direct.returncode == 0
    assert p.stdout == direct.stdout and b"gyre-bench" in p.stdout and b"load" in p.stdout
    p = gyre("bench", "load", "--help")
    assert p.returncode == 0 and b"Usage: gyre-bench load" in p.stdout and b"--streams" in p.stdout, p
    # Its exit status is gyre bench's (clap's 2 for a usage error).
    p = gyre("bench", "load", "--no-such-flag")
    assert p.returncode == 2 and b"--no-such-flag" in p.stderr, p


def test_bench_without_gyre_bench_says_how_to_build_it(tmp_path):
    lone = tmp_path / "gyre"
    shutil.copy2(harness.GYRE_BIN, lone)
    p = gyre("bench", "--help", binary=lone)
    assert p.returncode == 1, p
    err = p.stderr.decode()
    assert "gyre-bench" in err and "cargo build --release --workspace --bins" in err and "make build" in err, err


# ---------------------------------------------------------------------------
# The config file's flags


def config_server(config, *flags: str, env: dict | None = None) -> harness.Server:
    return harness.Server.start([str(harness.GYRE_BIN), "serve", "--config", str(config),
                                 "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", *flags],
                                env=env)


def served_ids(server: harness.Server) -> list[str]:
    return [m["id"] for m in harness.http_json(server.http, "/v1/models").json()["data"]]


def test_config_file_flags_and_their_precedence(tmp_path):
    config = tmp_path / "gyre.toml"
    config.write_text(f"""
served-model-name = "from-file"
kv_cache_mib = 16
disable-metrics = true
cors-allow-origin = ["https://file.example"]

[[models]]
source = {json.dumps(str(harness.model_dir(QWEN)))}
""")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYRE_")}
    origin = {"Origin": "https://file.example"}

    server = config_server(config, env=env)
    try:
        assert served_ids(server) == ["from-file"]
        assert harness.http_request(server.http, "GET", "/metrics").status == 404
        r = harness.http_json(server.http, "/v1/models", headers=origin)
        assert r.headers.get("access-control-allow-origin") == "https://file.example"
    finally:
        server.stop()
        assert_no_panic(server)
        server.remove_log()

    # The environment beats the file; the flag beats both.
    with_env = {**env, "GYRE_SERVED_MODEL_NAME": "from-env", "GYRE_DISABLE_METRICS": "false"}
    server = config_server(config, env=with_env)
    try:
        assert served_ids(server) == ["from-env"]
        assert harness.http_request(server.http, "GET", "/metrics").status == 200
    finally:
        server.stop()
        assert_no_panic(server)
        server.remove_log()
    server = config_server(config, "--served-model-name", "from-flag", "--cors-allow-origin",
                           "https://flag.example", env=with_env)
    try:
        assert served_ids(server) == ["from-flag"]
        r = harness.http_json(server.http, "/v1/models", headers=origin)
        assert "access-control-allow-origin" not in r.headers
    finally:
        server.stop()
        assert_no_panic(server)
        server.remove_log()


@pytest.mark.parametrize("text,words", [
    ("no-such-flag = 1\n", ["unknown key `no-such-flag`"]),
    ("kv-cache-mib = \"lots\"\n", ["`kv-cache-mib`", "lots"]),
    ("disable-metrics = \"yes\"\n", ["`disable-metrics`", "true or false"]),
    ("max-running = [1, 2]\n", ["`max-running`", "a list"]),
])
def test_a_bad_config_key_fails_the_start_naming_it(tmp_path, text, words):
    config = tmp_path / "bad.toml"
    config.write_text(text + f"[[models]]\nsource = {json.dumps(str(harness.model_dir(QWEN)))}\n")
    p = gyre("serve", "--config", str(config), "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0")
    assert p.returncode == 1, p
    assert b"listening" not in p.stdout
    err = p.stderr.decode()
    assert str(config) in err, err
    for w in words:
        assert w in err, err


# ---------------------------------------------------------------------------
# --help


def test_help_groups_flags_by_topic():
    p = gyre("serve", "--help")
    assert p.returncode == 0
    out = p.stdout.decode()
    for heading in ["Models:", "Speculative decoding:", "Scheduler and KV cache:", "Serving and network:",
                    "Security (keys, TLS, CORS):", "Responses store and idempotency:",
                    "Observability (logs, metrics, tracing):"]:
        assert heading in out, out
    # Each flag sits under its topic.
    section = out.split("Scheduler and KV cache:")[1].split("\n\n")[0]
    assert "--kv-cache-mib" in section and "--max-running" in section, section
    top = gyre("--help").stdout.decode()
    for command in ["serve", "grpc", "chat", "models", "bench"]:
        assert f"\n  {command} " in top, top
    assert "Observability (logs, metrics, tracing):" in top
