"""gyre-bench's GPU scenarios, G1 and G2, end to end on the CPU at tiny sizes.

G1 drives each concurrency level over gRPC and over HTTP and compares with
transformers' static batches of the same sizes (all in one Python process);
G2 measures TTFT of long prompts as a burst and in a closed-loop steady
state, with transformers' batch-1 TTFT beside it. This runs `gyre-bench run
--quick --only G1,G2` with small levels against the quick bench model (built
under .gyre/bench by gyre-bench itself) and checks what the JSON report
promises: a row per level and protocol, every token accounted for, the
reference at the right batch sizes, ordered percentiles, the steady mode's
staggered closed loop. Nothing here depends on how fast the machine is.

Environment: GYRE_BENCH_BIN (gyre-bench beside GYRE_BIN), GYRE_BIN.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import harness

BENCH_BIN = harness._env_path("GYRE_BENCH_BIN", harness.GYRE_BIN.parent / "gyre-bench")

LEVELS = (1, 3)
G1_PROMPT, G1_NEW = 16, 6
G2_STREAMS, G2_PROMPT, G2_NEW, G2_REQUESTS = 3, 96, 4, 2
APIS = ("gRPC", "HTTP")


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    bench = harness.require_file(BENCH_BIN, "gyre-bench (GYRE_BENCH_BIN)")
    gyre = harness.require_file(harness.GYRE_BIN, "gyre (GYRE_BIN)")
    out = tmp_path_factory.mktemp("bench-g") / "g.json"
    argv = [
        str(bench), "run", "--quick", "--only", "G1,G2", "--threads", "2",
        "--python", sys.executable, "--gyre-bin", str(gyre), "--json-out", str(out),
        "--hf-repeats", "1",
        "--g1-streams", ",".join(map(str, LEVELS)),
        "--g1-prompt-tokens", str(G1_PROMPT), "--g1-new-tokens", str(G1_NEW),
        "--g2-streams", str(G2_STREAMS), "--g2-prompt-tokens", str(G2_PROMPT),
        "--g2-new-tokens", str(G2_NEW), "--g2-requests", str(G2_REQUESTS),
        # Passed through to `gyre serve`, as tests/gpu/device.sh does.
        "--server-arg=--max-running=16", "--server-arg=--max-batch-tokens=256",
    ]
    # Nothing from the caller's environment may redirect the run.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYRE_BENCH_")}
    proc = subprocess.run(argv, cwd=harness.REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, (
        f"gyre-bench failed ({proc.returncode}):\nstdout:\n{proc.stdout[-3000:]}\n"
        f"stderr:\n{proc.stderr[-5000:]}")
    data = json.loads(out.read_text(encoding="utf-8"))
    data["_stdout"] = proc.stdout
    return data


def scenario(report: dict, sid: str) -> dict:
    found = [s for s in report["scenarios"] if s["id"] == sid]
    assert len(found) == 1, [s["id"] for s in report["scenarios"]]
    assert found[0]["error"] is None, found[0]["error"]
    return found[0]


def streams(n: int) -> str:
    return "1 stream" if n == 1 else f"{n} streams"


def assert_ordered(dist: dict, what: str) -> None:
    assert dist["n"] > 0, what
    assert dist["min"] <= dist["p50"] <= dist["p99"] <= dist["max"], (what, dist)


def test_only_the_named_scenarios_run(report):
    assert [s["id"] for s in report["scenarios"]] == ["G1", "G2"]
    assert report["sizes"]["g1_streams"] == list(LEVELS)
    assert (report["sizes"]["g2_streams"], report["sizes"]["g2_prompt"]) == (G2_STREAMS, G2_PROMPT)
    assert "G1" in report["_stdout"] and "G2" in report["_stdout"]


def test_g1_measures_every_level_on_both_protocols(report):
    g1 = scenario(report, "G1")
    d = g1["details"]
    assert d["levels"] == list(LEVELS)
    runs = {(r["streams"], r["api"]): r for r in d["runs"]}
    assert sorted(runs) == sorted((n, api) for n in LEVELS for api in APIS)
    for (n, api), r in runs.items():
        what = f"{n} streams {api}"
        assert (r["requests"], r["errors"]) == (n, 0), (what, r["error_samples"])
        assert r["output_tokens"] == r["expected_output_tokens"] == n * G1_NEW, what
        # Distinct prompts, a salt per request: nothing comes from the prefix cache.
        assert r["cached_tokens"] == 0, what
        assert r["output_tok_per_s"] > 0 and r["wall_s"] > 0, what
        assert r["output_tok_per_s"] == pytest.approx(r["output_tokens"] / r["wall_s"]), what
        assert_ordered(r["ttft_ms"], f"{what} TTFT")
        assert r["ttft_ms"]["n"] == n, what
        assert_ordered(r["itl_ms"], f"{what} ITL")
    # The table: a throughput row and a latency row per level and protocol.
    metrics = [row["metric"] for row in g1["rows"]]
    for n in LEVELS:
        for api in APIS:
            assert f"{streams(n)} output tok/s ({api})" in metrics
            assert f"  {streams(n)} TTFT p50/p99, ITL p50/p99 ms ({api})" in metrics
    assert len(metrics) == 2 * 2 * len(LEVELS)


def test_g1_compares_with_transformers_at_each_level(report):
    d = scenario(report, "G1")["details"]
    assert d["hf_error"] is None
    assert d["hf_load_seconds"] > 0
    points = d["hf"]["points"]
    assert [p["batch"] for p in points] == list(LEVELS)
    for p in points:
        assert p["error"] is None, p
        res = p["result"]
        assert res["mode"] == "generate"
        assert (res["batch"], res["prompt_tokens"], res["new_tokens"]) == (p["batch"], G1_PROMPT, G1_NEW)
        assert len(res["runs"]) == 1 and res["device"] == "cpu"
        assert res["tok_per_s"] == pytest.approx(p["batch"] * G1_NEW / res["seconds"])
    by_batch = {p["batch"]: p["result"]["tok_per_s"] for p in points}
    rows = {row["metric"]: row for row in scenario(report, "G1")["rows"]}
    for r in d["runs"]:
        assert r["hf_tok_per_s"] == by_batch[r["streams"]]
        assert r["ratio"] == pytest.approx(r["output_tok_per_s"] / r["hf_tok_per_s"])
        row = rows[f"{streams(r['streams'])} output tok/s ({r['api']})"]
        assert row["ratio"] == pytest.approx(r["ratio"])
        assert f"(batch {r['streams']})" in row["reference"]


def test_g2_burst_and_steady(report):
    g2 = scenario(report, "G2")
    d = g2["details"]
    assert (d["streams"], d["prompt_tokens"], d["new_tokens"], d["requests_per_stream"]) == (
        G2_STREAMS, G2_PROMPT, G2_NEW, G2_REQUESTS)
    burst = d["burst"]["summary"]
    assert (burst["requests"], burst["errors"]) == (G2_STREAMS, 0), burst["error_samples"]
    assert burst["output_tokens"] == d["burst"]["expected_output_tokens"] == G2_STREAMS * G2_NEW
    assert_ordered(burst["ttft_ms"], "burst TTFT")
    assert len(d["burst"]["ttft_ms"]) == G2_STREAMS

    steady = d["steady"]
    total = G2_STREAMS * G2_REQUESTS
    assert (steady["all"]["requests"], steady["all"]["errors"]) == (total, 0), steady["all"]["error_samples"]
    assert steady["all"]["output_tokens"] == steady["expected_output_tokens"] == total * G2_NEW
    later = steady["after_first"]
    assert later["requests"] == G2_STREAMS * (G2_REQUESTS - 1)
    assert_ordered(later["ttft_ms"], "steady TTFT")
    assert later["ttft_ms"]["n"] == later["requests"]
    # The closed loop: each stream's requests in order, each sent after the
    # previous one ended, the first not before the stream's staggered start.
    reqs = steady["requests"]
    assert [(r["stream"], r["index"]) for r in reqs] == [
        (s, j) for s in range(G2_STREAMS) for j in range(G2_REQUESTS)]
    stagger_ms = steady["stagger_s"] * 1e3
    assert stagger_ms > 0
    for s in range(G2_STREAMS):
        mine = reqs[s * G2_REQUESTS:(s + 1) * G2_REQUESTS]
        assert mine[0]["sent_at_ms"] >= stagger_ms * s / G2_STREAMS - 0.01, (s, mine[0])
        for prev, cur in zip(mine, mine[1:]):
            assert cur["sent_at_ms"] >= prev["sent_at_ms"] + prev["elapsed_ms"] - 0.01, (prev, cur)
        assert all(r["tokens"] == G2_NEW and r["cached_tokens"] == 0 for r in mine)


def test_g2_reports_against_the_objective_and_transformers(report):
    g2 = scenario(report, "G2")
    d = g2["details"]
    assert d["slo_ttft_ms"] == 800
    p99 = d["steady"]["after_first"]["ttft_ms"]["p99"]
    assert d["steady"]["met"] == (p99 <= 800)
    burst_row, steady_row = g2["rows"]
    assert burst_row["metric"].startswith(f"burst: {G2_STREAMS} x {G2_PROMPT}-token prompts")
    assert steady_row["metric"].startswith(f"steady: {G2_STREAMS} streams x {G2_REQUESTS} requests")
    assert steady_row["target"] == "p99 <= 800 ms"
    assert steady_row["ratio"] == pytest.approx(p99)
    assert steady_row["met"] == ("yes" if p99 <= 800 else "no")
    # transformers' TTFT of one such prompt alone, measured in G1's process.
    assert d["hf_error"] is None
    hf = d["hf_ttft"]
    assert (hf["mode"], hf["batch"], hf["prompt_tokens"], hf["new_tokens"]) == ("ttft", 1, G2_PROMPT, 1)
    assert hf["seconds"] > 0
    assert "transformers, 1 prompt alone" in steady_row["reference"]
