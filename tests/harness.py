"""Helpers of the end-to-end tests: real gyre processes, `buf curl`, raw HTTP.

- `Server` starts `gyre serve` / `gyre grpc` (or `gyre-shim`) as a subprocess on
  port 0, reads the announced addresses from stdout (no sleeps, no fixed
  ports), keeps stderr in a file for failure messages, and stops with SIGTERM.
- `buf_curl` runs `buf curl` with server reflection and parses its output: a
  sequence of JSON messages on stdout, a JSON error status on stderr.
- `http_json` / `http_sse` send raw HTTP with `http.client`, so tests see (and
  schema-validate) exactly the bytes the server sent.
"""

from __future__ import annotations

import http.client
import json
import os
import platform
import queue
import re
import signal
import subprocess
import tempfile
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _env_path(name: str, default: Path) -> Path:
    """`$name` (relative to the working directory) or `default`."""
    value = os.environ.get(name)
    return Path(value).absolute() if value else default


GYRE_BIN = _env_path("GYRE_BIN", Path.home() / ".cache/gyre/target/release/gyre")
SHIM_BIN = _env_path("GYRE_SHIM_BIN", GYRE_BIN.parent / "gyre-shim")
MODELS = _env_path("GYRE_MODELS", REPO / ".gyre/models")
BUF = _env_path("BUF", REPO / "node_modules/.bin/buf")


def _native_buf(buf: Path) -> Path:
    """npm's `buf` is a node script that spawns the platform binary: use that
    binary directly when it is there (faster, and killing it kills buf)."""
    arch = {"x86_64": "x64", "aarch64": "aarch64", "arm64": "aarch64"}.get(platform.machine())
    try:
        real = buf.resolve()
        if arch is None or not real.read_bytes()[:64].startswith(b"#!/usr/bin/env node"):
            return buf
    except OSError:
        return buf
    native = real.parents[2] / f"buf-{sys.platform}-{arch}" / "bin" / "buf"
    return native if native.is_file() else buf


BUF = _native_buf(BUF)

STARTUP_TIMEOUT_S = 60.0
ANNOUNCE = re.compile(r"^(gyre|gyre-shim): (gRPC|HTTP|metrics) listening on (https?)://(\S+)\s*$")


def require_file(path: Path, what: str) -> Path:
    """Fails the test (never skips) when a prerequisite is missing."""
    if not path.exists():
        pytest.fail(f"{what} not found at {path}: build/set up first (`make setup build`)", pytrace=False)
    return path


def model_dir(name: str) -> Path:
    return require_file(MODELS / name, f"test model {name!r} (GYRE_MODELS)")


def golden(name: str) -> dict:
    path = require_file(model_dir(name) / "golden.json", f"golden outputs of {name}")
    return json.loads(path.read_text(encoding="utf-8"))


@dataclass
class Server:
    """A running gyre process and the addresses it announced."""

    argv: list[str]
    proc: subprocess.Popen
    stderr_path: Path
    grpc: str | None = None  # "127.0.0.1:PORT"
    http: str | None = None
    scheme: str = "http"  # "https" when the server announced TLS
    metrics: str | None = None  # --metrics-addr, when given
    _lines: queue.Queue = field(default_factory=queue.Queue)

    @classmethod
    def start(cls, argv: list[str], want: tuple[str, ...] = ("gRPC", "HTTP"), *,
              env: dict[str, str] | None = None, cwd: Path | None = None) -> "Server":
        """Starts `argv` in `cwd` (the repository) with `env` (this process's
        environment) plus `RUST_LOG`."""
        require_file(Path(argv[0]), "gyre binary (GYRE_BIN / GYRE_SHIM_BIN)")
        fd, err_name = tempfile.mkstemp(prefix="gyre-stderr-", suffix=".log")
        base = dict(os.environ if env is None else env)
        # Each server keeps its Responses store (default under
        # $XDG_DATA_HOME/gyre) in a directory of its own, never the user's.
        base.setdefault("XDG_DATA_HOME", tempfile.mkdtemp(prefix="gyre-data-"))
        with os.fdopen(fd, "wb") as err:
            proc = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                text=True, cwd=cwd or REPO, env={**base, "RUST_LOG": os.environ.get("RUST_LOG", "info")},
            )
        server = cls(argv=argv, proc=proc, stderr_path=Path(err_name))
        threading.Thread(target=server._pump, daemon=True).start()
        server._await_addresses(want)
        return server

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _await_addresses(self, want: tuple[str, ...]) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        found: dict[str, str] = {}
        while not all(w in found for w in want):
            left = deadline - time.monotonic()
            try:
                line = self._lines.get(timeout=max(left, 0.01)) if left > 0 else None
            except queue.Empty:
                line = None
            if line is None:
                why = "exited" if self.exited_on_its_own else f"timed out after {STARTUP_TIMEOUT_S:.0f}s"
                self.stop()
                pytest.fail(
                    f"{' '.join(self.argv)} did not announce its {' and '.join(want)} address ({why}, "
                    f"exit code {self.proc.returncode}); stderr:\n{self.stderr()[-4000:]}",
                    pytrace=False,
                )
            m = ANNOUNCE.match(line)
            if m:
                found[m.group(2)] = m.group(4)
                if m.group(2) != "metrics":
                    self.scheme = m.group(3)
        self.grpc, self.http = found.get("gRPC"), found.get("HTTP")
        self.metrics = found.get("metrics")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    @property
    def exited_on_its_own(self) -> bool:
        try:
            self.proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            return False
        return True

    def alive(self) -> bool:
        return self.proc.poll() is None

    def cpu_seconds(self) -> float:
        """User + system CPU time the process has used so far."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def remove_log(self) -> None:
        self.stderr_path.unlink(missing_ok=True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def serve(model: str, *extra: str) -> Server:
    """`gyre serve` on `model` with both APIs on ephemeral loopback ports."""
    argv = [str(GYRE_BIN), "serve", "--model", str(model_dir(model)),
            "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", *extra]
    return Server.start(argv)


# ---------------------------------------------------------------------------
# buf curl


@dataclass
class BufResult:
    rc: int
    messages: list[dict]
    stderr: str

    @property
    def error(self) -> dict | None:
        """The error status buf printed on stderr (`{"code": "not_found", ...}`)."""
        start = self.stderr.find("{")
        if start < 0:
            return None
        try:
            return json.JSONDecoder().raw_decode(self.stderr[start:])[0]
        except json.JSONDecodeError:
            return None

    def ok(self) -> "BufResult":
        assert self.rc == 0, f"buf curl failed (rc {self.rc}): {self.stderr}"
        return self


def parse_json_stream(text: str) -> list[dict]:
    """Splits concatenated (pretty-printed) JSON documents."""
    decoder, out, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return out
        obj, i = decoder.raw_decode(text, i)
        out.append(obj)


def buf_curl(address: str, method: str | None, data=None, *, headers=(), protocol: str = "grpc",
             extra=(), timeout: float = 120.0) -> BufResult:
    """`buf curl` against `address` ("host:port"); `method` like "gyre.v1.Generation/ListModels".

    `data` is one JSON value (sent with `-d`) or a list of them (sent on stdin
    with `-d @-`, one message per line: client streaming / bidi).
    """
    require_file(BUF, "buf (BUF)")
    argv = [str(BUF), "curl", "--protocol", protocol, "--reflect"]
    if protocol == "grpc":
        argv.append("--http2-prior-knowledge")
    for h in headers:
        argv += ["-H", h]
    argv += list(extra)
    stdin = None
    if isinstance(data, list):
        argv += ["-d", "@-"]
        stdin = "".join(json.dumps(m) + "\n" for m in data)
    elif data is not None:
        argv += ["-d", json.dumps(data)]
    url = f"http://{address}" + (f"/{method}" if method else "")
    argv.append(url)
    p = run_group(argv, stdin, timeout)
    messages = parse_json_stream(p.stdout) if method else []
    return BufResult(p.returncode, messages, p.stderr + ("" if method else "\n" + p.stdout))


def run_group(argv: list[str], stdin: str | None, timeout: float) -> subprocess.CompletedProcess:
    """Runs `argv` in its own process group; on timeout the whole group is killed."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(argv)} took over {timeout:.0f}s; stderr:\n{err}", pytrace=False)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def list_lines(address: str, flag: str) -> list[str]:
    """`buf curl --list-services` / `--list-methods` output lines."""
    require_file(BUF, "buf (BUF)")
    argv = [str(BUF), "curl", "--protocol", "grpc", "--http2-prior-knowledge", "--reflect", flag,
            f"http://{address}"]
    p = run_group(argv, None, 60)
    assert p.returncode == 0, f"{' '.join(argv)} failed: {p.stderr}"
    return p.stdout.split()


# ---------------------------------------------------------------------------
# Raw HTTP


@dataclass
class HttpReply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)


def http_request(address: str, method: str, path: str, body: bytes | str | None = None,
                 headers: dict | None = None, timeout: float = 120.0) -> HttpReply:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        if isinstance(body, str):
            body = body.encode()
        hdrs = {"Content-Type": "application/json"} if body is not None else {}
        hdrs.update(headers or {})
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        return HttpReply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def http_json(address: str, path: str, payload=None, *, method: str | None = None, headers=None) -> HttpReply:
    body = None if payload is None else json.dumps(payload)
    return http_request(address, method or ("GET" if payload is None else "POST"), path, body, headers)


@dataclass
class SseReply:
    status: int
    headers: dict[str, str]
    events: list[str]  # raw `data:` payloads, "[DONE]" included
    raw: bytes

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1] == "[DONE]"

    def chunks(self) -> list[dict]:
        return [json.loads(e) for e in self.events if e != "[DONE]"]


def parse_sse(raw: bytes) -> list[str]:
    """The `data:` payloads of an SSE body (multi-line data joined with newlines)."""
    events, data = [], []
    for line in raw.decode("utf-8").splitlines():
        if line == "":
            if data:
                events.append("\n".join(data))
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        events.append("\n".join(data))
    return events


def http_sse(address: str, path: str, payload: dict, headers=None) -> SseReply:
    """POSTs `payload` and reads the whole (streamed) body."""
    reply = http_request(address, "POST", path, json.dumps(payload), headers)
    events = parse_sse(reply.body) if reply.headers.get("content-type", "").startswith("text/event-stream") else []
    return SseReply(reply.status, reply.headers, events, reply.body)
