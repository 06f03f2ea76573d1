"""A serving benchmark users run against OpenAI-compatible servers, run
against gyre: NVIDIA's AIPerf (`aiperf profile`, the Python registry's
`aiperf` 0.13.0, in its own venv: `make aiperf`, ~/.cache/gyre/aiperf-venv
or $GYRE_AIPERF_VENV).

AIPerf makes synthetic prompts of a given token length with the model's
tokenizer, so the test first writes SmolLM2-135M-Instruct's tokenizer out
of the default model's GGUF (transformers reads GGUF tokenizers) and
points `--tokenizer` at it. Then 16 streamed chat requests, 4 at a time,
64 prompt tokens and 32 output tokens each (`ignore_eos`, so every request
runs to its length), against `gyre serve` with no arguments (the real
default model). The run must complete with no errors, and AIPerf's report
must agree with gyre's own figures: 16 requests, 32 completion tokens each
by the usage AIPerf read from the stream, TTFT and inter-token latency
measured for every request, and gyre's `/metrics` counting the same 16
requests ending on `length` and 512 generated tokens. The report (JSON,
CSV, console table) is kept under $GYRE_ARTIFACTS/aiperf (default
.gyre/artifacts/aiperf).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import harness

AIPERF_VENV = harness._env_path("GYRE_AIPERF_VENV", Path.home() / ".cache/gyre/aiperf-venv")
ARTIFACTS = Path(os.environ.get("GYRE_ARTIFACTS") or harness.REPO / ".gyre" / "artifacts").absolute()
MODEL = "smollm2-135m-instruct"
REQUESTS, CONCURRENCY, ISL, OSL = 16, 4, 64, 32


@pytest.fixture(scope="module")
def server():
    s = harness.Server.start([str(harness.GYRE_BIN), "serve",
                              "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"])
    yield s
    s.stop()
    assert "panicked" not in s.stderr()
    s.remove_log()


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    """SmolLM2's tokenizer, written from the default model's GGUF."""
    gguf = harness.require_file(harness.MODELS / f"{MODEL}.gguf", "the default model (make setup)").resolve()
    out = tmp_path_factory.mktemp("smollm2-tokenizer")
    code = ("import sys; from transformers import AutoTokenizer; "
            "t = AutoTokenizer.from_pretrained(sys.argv[1], gguf_file=sys.argv[2]); t.save_pretrained(sys.argv[3])")
    subprocess.run([sys.executable, "-c", code, str(gguf.parent), gguf.name, str(out)], check=True,
                   timeout=300)
    assert (out / "tokenizer.json").is_file()
    return out


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}\{{(.*)\}} (\S+)$", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            total += float(m.group(2))
    return total


def test_aiperf_profile_runs_to_completion_and_agrees_with_gyre(server, tokenizer_dir):
    aiperf = harness.require_file(AIPERF_VENV / "bin" / "aiperf", "AIPerf (make aiperf)")
    out = ARTIFACTS / "aiperf"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = dict(os.environ)
    # AIPerf's offline mode looks a tokenizer up in the hub cache only (a
    # local directory then fails); with it unset a local path loads as is,
    # and nothing is fetched (the path exists).
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("TRANSFORMERS_OFFLINE", None)
    cmd = [str(aiperf), "profile", "--model", MODEL, "--url", f"http://{server.http}",
           "--endpoint-type", "chat", "--streaming", "--tokenizer", str(tokenizer_dir),
           "--extra-inputs", "ignore_eos:true",
           "--concurrency", str(CONCURRENCY), "--request-count", str(REQUESTS),
           "--prompt-input-tokens-mean", str(ISL), "--prompt-input-tokens-stddev", "0",
           "--prompt-output-tokens-mean", str(OSL), "--prompt-output-tokens-stddev", "0",
           "--random-seed", "7", "--output-artifact-dir", str(out), "--no-auto-plot"]
    run = subprocess.run(cmd, env=env, cwd=out, capture_output=True, text=True, timeout=900)
    (out / "aiperf-stdout.txt").write_text(run.stdout + run.stderr)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]

    report = json.loads((out / "profile_export_aiperf.json").read_text())
    assert report["request_count"]["avg"] == REQUESTS
    assert report.get("error_summary") in (None, [], {}), report.get("error_summary")
    assert report["request_error_rate"]["avg"] == 0
    assert report["was_cancelled"] is False
    # The usage gyre streamed: every request ran to its 32 tokens.
    usage = report["usage_completion_tokens"]
    assert usage["count"] == REQUESTS and usage["min"] == OSL and usage["max"] == OSL, usage
    assert report["input_sequence_length"]["avg"] == ISL
    # Streamed timing, for every request.
    for key in ("time_to_first_token", "inter_token_latency", "request_latency"):
        m = report[key]
        assert m["count"] == REQUESTS and m["min"] > 0, (key, m)
    assert report["time_to_first_token"]["max"] < report["request_latency"]["max"]
    assert report["output_token_throughput"]["avg"] > 0

    # gyre's own counters saw the same load.
    scrape = harness.http_request(server.http, "GET", "/metrics")
    assert scrape.status == 200
    text = scrape.body.decode()
    assert metric(text, "gyre:request_success_total", model_name=MODEL, finished_reason="length") == REQUESTS
    assert metric(text, "gyre:generation_tokens_total", model_name=MODEL) == REQUESTS * OSL
    print(f"aiperf: {report['output_token_throughput']['avg']:.1f} output tok/s, "
          f"TTFT p50 {report['time_to_first_token']['p50']:.0f} ms; report in {out}")
