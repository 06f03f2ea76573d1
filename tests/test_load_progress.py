"""Model loading shows its progress where the server's stderr goes.

- To a file or pipe (as for every server the harness starts): one plain log
  line per weights file (its path, shard number, bytes, tensors, seconds) and
  a total (bytes, tensors, seconds, device), with no terminal codes; as JSON
  objects with `--log-format json`. Checked for one safetensors file, for
  two shards, and for a GGUF file, against the files' real sizes and tensor
  counts.
- To a terminal (a pseudo-terminal from Python's `pty`): a bar redrawn in
  place with bytes and time, and a line kept per finished file.
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import threading
import time
from pathlib import Path

import harness
import hf_cache

FILE_LINE = re.compile(
    r'weights file loaded file=(\S+) shard="(\d+)/(\d+)" bytes=(\d+) size="[^"]+" tensors=(\d+) secs="(\d+\.\d+)"')
TOTAL_LINE = re.compile(r'weights loaded bytes=(\d+) size="[^"]+" tensors=(\d+) secs="(\d+\.\d+)" device="(\w+)"')


def safetensors_count(path: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(path), "np") as f:
        return len(list(f.keys()))


def loaded_files(log: str) -> list[tuple[str, int, int, int, int]]:
    """(file, shard, of, bytes, tensors) of each per-file line."""
    return [(m[1], int(m[2]), int(m[3]), int(m[4]), int(m[5])) for m in FILE_LINE.finditer(log)]


def total(log: str) -> tuple[int, int, str]:
    found = TOTAL_LINE.findall(log)
    assert len(found) == 1, log[-3000:]
    bytes_, tensors, _secs, device = found[0]
    return int(bytes_), int(tensors), device


def grpc_log(*flags: str) -> str:
    """The stderr (a file) of a `gyre grpc` that started with `flags`."""
    argv = [str(harness.GYRE_BIN), "grpc", "--grpc-addr", "127.0.0.1:0", *flags]
    server = harness.Server.start(argv, want=("gRPC",))
    server.stop()
    log = server.stderr()
    server.remove_log()
    assert "panicked" not in log, log[-4000:]
    return log


def test_piped_logs_have_a_plain_line_per_file_and_a_total(qwen):
    log = qwen.stderr()
    weights = harness.model_dir("tiny-qwen2") / "model.safetensors"
    size, count = weights.stat().st_size, safetensors_count(weights)
    assert loaded_files(log) == [(str(weights), 1, 1, size, count)], log[-3000:]
    assert total(log) == (size, count, "cpu")
    assert "\x1b" not in log and "\r" not in log


def test_each_shard_has_its_line(tmp_path):
    files = hf_cache.sharded_model_files("tiny-qwen2")
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    log = grpc_log("--model", str(tmp_path))
    shards = sorted(n for n in files if n.endswith(".safetensors"))
    want = [(str(tmp_path / n), i + 1, 2, (tmp_path / n).stat().st_size, safetensors_count(tmp_path / n))
            for i, n in enumerate(shards)]
    assert loaded_files(log) == want, log[-3000:]
    assert total(log) == (sum(w[3] for w in want), sum(w[4] for w in want), "cpu")


def test_a_gguf_file_reports_its_size_and_tensors():
    from gguf import GGUFReader

    path = harness.require_file(harness.MODELS / "smollm2-135m-instruct.gguf", "the default model (make setup)")
    count = len(GGUFReader(str(path)).tensors)
    log = grpc_log("--model", str(path))
    size = path.stat().st_size
    assert loaded_files(log) == [(str(path), 1, 1, size, count)], log[-3000:]
    assert total(log) == (size, count, "cpu")


def test_json_logs_carry_the_progress_fields():
    log = grpc_log("--model", str(harness.model_dir("tiny-llama")), "--log-format", "json")
    events = [json.loads(line) for line in log.splitlines() if line.strip()]
    by_message = {e["fields"].get("message"): e["fields"] for e in events}
    weights = harness.model_dir("tiny-llama") / "model.safetensors"
    file = by_message["weights file loaded"]
    assert (file["file"], file["bytes"], file["shard"]) == (str(weights), weights.stat().st_size, "1/1")
    assert float(file["secs"]) >= 0
    done = by_message["weights loaded"]
    assert (done["bytes"], done["tensors"], done["device"]) == (weights.stat().st_size,
                                                                safetensors_count(weights), "cpu")


class PtyReader:
    """Collects everything written to a pseudo-terminal's other end."""

    def __init__(self, master: int):
        self.master, self.data, self.cond = master, b"", threading.Condition()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every writer has closed the terminal
                chunk = b""
            with self.cond:
                self.data += chunk
                self.cond.notify_all()
            if not chunk:
                return

    def wait_for(self, needle: bytes, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        with self.cond:
            while needle not in self.data and self.thread.is_alive():
                if not self.cond.wait(timeout=max(deadline - time.monotonic(), 0)):
                    break
            return self.data


def test_a_terminal_gets_a_bar_redrawn_in_place():
    model = harness.model_dir("tiny-llama")
    master, slave = pty.openpty()
    argv = [str(harness.GYRE_BIN), "grpc", "--model", str(model), "--grpc-addr", "127.0.0.1:0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, text=True,
                            cwd=harness.REPO, env={**os.environ, "RUST_LOG": "info"})
    os.close(slave)
    reader = PtyReader(master)
    try:
        announced = proc.stdout.readline()
        assert harness.ANNOUNCE.match(announced), (announced, reader.data[-3000:])
        data = reader.wait_for(b"weights loaded", timeout=15)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        reader.thread.join(timeout=10)
        os.close(master)
    text = data.decode("utf-8", errors="replace")
    assert "\r\x1b[2Kloading weights [" in text, text[-3000:]
    bar = re.search(r"\[#{30}\] 100% (\S+ \S+) / (\S+ \S+) +\d+\.\ds +\(1/1\) model\.safetensors", text)
    assert bar and bar[1] == bar[2], text[-3000:]
    assert f"loaded (1/1) {model / 'model.safetensors'}: {bar[2]}, " in text
    assert "weights file loaded" not in text, "the terminal got the plain per-file line too"
    assert "weights loaded" in text and "panicked" not in text
