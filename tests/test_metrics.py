"""Prometheus metrics (`/metrics`): the exposition a real `gyre serve` gives
after real requests (every documented name with its labels, histogram
buckets from 1 ms to minutes, counts that match what was sent, engine
figures that match GetStats), the API key (or a tenant key of the keys
file) on the HTTP port unless `--open-endpoints`, the open `--metrics-addr`,
`--metrics-vllm-names`, `--disable-metrics`, and a real
Prometheus server (the Debian package) scraping gyre every second and
answering a counter and a histogram query through its HTTP API."""

import json
import math
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

import pytest

import harness

MODEL = "tiny-llama"
KEY = "metrics-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

# Every metric of README's "Operations: metrics" table that a chat request,
# an unknown model and a scrape produce, with its type.
EXPECTED = {
    "gyre:request_success_total": "counter",
    "gyre:prompt_tokens_total": "counter",
    "gyre:prompt_tokens_cached_total": "counter",
    "gyre:generation_tokens_total": "counter",
    "gyre:request_errors_total": "counter",
    "gyre:http_requests_total": "counter",
    "gyre:e2e_request_latency_seconds": "histogram",
    "gyre:time_to_first_token_seconds": "histogram",
    "gyre:inter_token_latency_seconds": "histogram",
    "gyre:request_queue_time_seconds": "histogram",
    "gyre:request_prefill_time_seconds": "histogram",
    "gyre:request_decode_time_seconds": "histogram",
    "gyre:request_inference_time_seconds": "histogram",
    "gyre:num_requests_running": "gauge",
    "gyre:num_requests_waiting": "gauge",
    "gyre:kv_cache_usage_perc": "gauge",
    "gyre:kv_blocks_used": "gauge",
    "gyre:kv_blocks_total": "gauge",
    "gyre:prefix_cache_queries_total": "counter",
    "gyre:prefix_cache_hits_total": "counter",
    "gyre:num_preemptions_total": "counter",
}
BUCKETS = ["0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.075", "0.1", "0.25", "0.5",
           "0.75", "1", "2.5", "5", "10", "20", "40", "80", "160", "600", "+Inf"]


def parse(text: str) -> tuple[dict[str, str], list[tuple[str, dict, float]]]:
    """The `# TYPE`s and the samples (name, labels, value) of an exposition."""
    types, samples = {}, []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        elif line and not line.startswith("#"):
            m = SAMPLE.match(line)
            assert m, f"not a sample line: {line!r}"
            samples.append((m.group(1), dict(LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return types, samples


def value(samples, name: str, **labels) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    return sum(v for n, l, v in samples if n == name and all(l.get(k) == x for k, x in labels.items()))


def scrape(address: str, headers=None) -> harness.HttpReply:
    return harness.http_request(address, "GET", "/metrics", headers=headers)


def chat(server: harness.Server, content: str, headers=AUTH, **extra) -> dict:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": 6, "temperature": 0, **extra}
    reply = harness.http_json(server.http, "/v1/chat/completions", body, headers=headers)
    assert reply.status == 200, reply.body
    return reply.json()


@pytest.fixture(scope="module")
def server(module_server) -> harness.Server:
    return module_server(MODEL, "--api-key", KEY, "--metrics-addr", "127.0.0.1:0")


def test_metrics_after_real_requests_have_every_name_label_and_count(server):
    usages = [chat(server, f"hello number {i}")["usage"] for i in range(3)]
    streamed = harness.http_sse(server.http, "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "a stream"}], "max_tokens": 5,
        "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}, headers=AUTH)
    assert streamed.done
    usages.append(streamed.chunks()[-1]["usage"])
    missing = harness.http_json(server.http, "/v1/chat/completions", {
        "model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}, headers=AUTH)
    assert missing.status == 404

    reply = scrape(server.http, AUTH)
    assert reply.status == 200, reply.body
    assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    types, samples = parse(reply.body.decode())
    for name, kind in EXPECTED.items():
        assert types.get(name) == kind, f"{name}: {types.get(name)} in\n{reply.body.decode()}"
    helped = {line.split(" ")[2] for line in reply.body.decode().splitlines() if line.startswith("# HELP ")}
    assert set(EXPECTED) <= helped, set(EXPECTED) - helped
    engine_names = [n for n in EXPECTED if n not in ("gyre:request_errors_total", "gyre:http_requests_total")]
    for name in engine_names:
        labelled = [l for n, l, _ in samples if n.startswith(name)]
        assert labelled and all(l.get("model_name") == MODEL for l in labelled), (name, labelled)

    # Counts match what was sent.
    assert value(samples, "gyre:request_success_total", model_name=MODEL) == 4
    assert value(samples, "gyre:prompt_tokens_total") == sum(u["prompt_tokens"] for u in usages)
    assert value(samples, "gyre:generation_tokens_total") == sum(u["completion_tokens"] for u in usages)
    for h in ("e2e_request_latency_seconds", "time_to_first_token_seconds",
              "request_queue_time_seconds", "request_prefill_time_seconds"):
        assert value(samples, f"gyre:{h}_count") == 4, h
    # One gap per token after each choice's first.
    gaps = sum(u["completion_tokens"] - 1 for u in usages)
    assert value(samples, "gyre:inter_token_latency_seconds_count") == gaps
    assert value(samples, "gyre:request_errors_total", code="model_not_found") == 1
    assert value(samples, "gyre:http_requests_total", route="/v1/chat/completions", status="200") == 4
    assert value(samples, "gyre:http_requests_total", route="/v1/chat/completions", status="404") == 1

    # Buckets from 1 ms to 10 minutes, cumulative, ending at the count.
    les = [l["le"] for n, l, _ in samples if n == "gyre:e2e_request_latency_seconds_bucket"]
    assert les == BUCKETS
    counts = [v for n, _, v in samples if n == "gyre:e2e_request_latency_seconds_bucket"]
    assert counts == sorted(counts) and counts[-1] == 4

    # Engine figures are the engine's own (GetStats), read at the scrape.
    [stats] = harness.buf_curl(server.grpc, "gyre.v1.Generation/GetStats", {"model": MODEL},
                               headers=[f"authorization: Bearer {KEY}"]).ok().messages
    assert value(samples, "gyre:kv_blocks_total") == int(stats["kvBlocksTotal"])
    assert value(samples, "gyre:prefix_cache_queries_total") == int(stats.get("prefixQueryTokensTotal", 0))
    assert value(samples, "gyre:num_requests_running") == 0
    assert value(samples, "gyre:num_requests_waiting") == 0


def test_the_http_port_wants_the_key_and_the_metrics_address_does_not(server):
    refused = scrape(server.http)
    assert refused.status == 401
    assert set(refused.json()["error"]) == {"message", "type", "param", "code"}
    open_reply = scrape(server.metrics)
    assert open_reply.status == 200
    assert "gyre:kv_blocks_total{" in open_reply.body.decode()
    # It serves /metrics only.
    assert harness.http_request(server.metrics, "GET", "/v1/models").status == 404


def assert_refused(reply: harness.HttpReply):
    assert reply.status == 401, reply.body
    err = reply.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert err["code"] == "invalid_api_key", err


def test_with_a_keys_file_the_http_port_wants_a_tenant_key_and_the_metrics_address_does_not(
        module_server, tmp_path):
    from test_tenants import keys_file
    path = tmp_path / "keys.toml"
    path.write_text(keys_file({"team": {"requests_per_minute": 100}}, {"key-team": "team"}))
    server = module_server(MODEL, "--keys-file", str(path), "--metrics-addr", "127.0.0.1:0")
    chat(server, "hi", headers={"Authorization": "Bearer key-team"})
    assert_refused(scrape(server.http))
    assert_refused(scrape(server.http, headers={"Authorization": "Bearer key-nobody"}))
    served = scrape(server.http, headers={"Authorization": "Bearer key-team"})
    assert served.status == 200, served.body
    _, samples = parse(served.body.decode())
    assert value(samples, "gyre:request_success_total", model_name=MODEL) == 1
    # The operator's own address stays open.
    assert scrape(server.metrics).status == 200


@pytest.mark.parametrize("auth", ["keys_file", "api_key"])
def test_open_endpoints_leaves_the_http_ports_metrics_open(module_server, tmp_path, auth):
    from test_tenants import keys_file
    if auth == "keys_file":
        path = tmp_path / "keys.toml"
        path.write_text(keys_file({"team": {}}, {"key-team": "team"}))
        flags, key = ("--keys-file", str(path)), "key-team"
    else:
        flags, key = ("--api-key", KEY), KEY
    server = module_server(MODEL, *flags, "--open-endpoints")
    chat(server, "hi", headers={"Authorization": f"Bearer {key}"})
    reply = scrape(server.http)
    assert reply.status == 200, reply.body
    _, samples = parse(reply.body.decode())
    assert value(samples, "gyre:request_success_total", model_name=MODEL) == 1
    # Only /metrics is opened: generation still wants the key.
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert harness.http_json(server.http, "/v1/chat/completions", body).status == 401


def test_vllm_names_flag_renames_the_metrics_vllm_has(module_server):
    server = module_server(MODEL, "--metrics-vllm-names")
    chat(server, "hi", headers=None)
    text = scrape(server.http).body.decode()
    types, samples = parse(text)
    for name in ("prompt_tokens_total", "generation_tokens_total", "time_to_first_token_seconds",
                 "num_requests_running", "kv_cache_usage_perc", "request_success_total"):
        assert f"vllm:{name}" in types, (name, text)
        assert f"gyre:{name}" not in types, (name, text)
    assert value(samples, "vllm:request_success_total", model_name=MODEL) == 1
    # Metrics vLLM has no counterpart of keep gyre's name.
    assert types.get("gyre:http_requests_total") == "counter"
    assert types.get("gyre:kv_blocks_total") == "gauge"


def test_disable_metrics_answers_404_in_the_openai_shape(module_server):
    server = module_server(MODEL, "--disable-metrics")
    chat(server, "hi", headers=None)
    reply = scrape(server.http)
    assert reply.status == 404
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "metrics_disabled"


# ---------------------------------------------------------------------------
# A real Prometheus server


def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if not found:
        pytest.fail("the `prometheus` server is not installed: `make test` installs the Debian package "
                    "when run as root (apt-get install prometheus)", pytrace=False)
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """A Prometheus server scraping `target` every second, ready once it says so."""

    def __init__(self, target: str):
        self.dir = Path(tempfile.mkdtemp(prefix="gyre-prometheus-"))
        config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                  "scrape_configs": [{"job_name": "gyre", "static_configs": [{"targets": [target]}]}]}
        (self.dir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        self.address = f"127.0.0.1:{free_port()}"
        self.proc = subprocess.Popen(
            [prometheus_binary(), f"--config.file={self.dir / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.dir / 'data'}", f"--web.listen-address={self.address}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log: list[str] = []
        ready = threading.Event()

        def pump():
            for line in self.proc.stderr:
                self.log.append(line)
                if "Server is ready to receive web requests" in line:
                    ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(60) or self.proc.poll() is not None:
            self.stop()
            pytest.fail("prometheus did not start:\n" + "".join(self.log[-40:]), pytrace=False)

    def query(self, expr: str) -> list:
        path = "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        reply = harness.http_request(self.address, "GET", path)
        assert reply.status == 200, reply.body
        body = reply.json()
        assert body["status"] == "success", body
        return body["data"]["result"]

    def wait_value(self, expr: str, want, timeout: float = 30.0) -> float:
        """Re-queries (each scrape is a second apart) until `want(value)`."""
        deadline = time.monotonic() + timeout
        got = None
        while time.monotonic() < deadline:
            result = self.query(expr)
            if result:
                got = float(result[0]["value"][1])
                if want(got):
                    return got
            time.sleep(0.25)
        pytest.fail(f"prometheus never answered {expr} as wanted (last: {got}); log:\n"
                    + "".join(self.log[-20:]), pytrace=False)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def test_a_real_prometheus_scrapes_gyre_and_answers_a_counter_and_a_histogram(module_server):
    server = module_server(MODEL, "--metrics-addr", "127.0.0.1:0")
    prom = Prometheus(server.metrics)
    try:
        sent = 5
        tokens = sum(chat(server, f"request {i}", headers=None)["usage"]["completion_tokens"]
                     for i in range(sent))
        got = prom.wait_value(f'sum(gyre:request_success_total{{model_name="{MODEL}"}})',
                              lambda v: v >= sent)
        assert got == sent
        assert prom.wait_value("sum(gyre:generation_tokens_total)", lambda v: v >= tokens) == tokens
        count = prom.wait_value("sum(gyre:e2e_request_latency_seconds_count)", lambda v: v >= sent)
        assert count == sent
        median = prom.wait_value(
            "histogram_quantile(0.5, sum by (le) (gyre:e2e_request_latency_seconds_bucket))",
            lambda v: not math.isnan(v))
        assert 0 < median <= 600
        [up] = prom.query('up{job="gyre"}')
        assert up["value"][1] == "1"
    finally:
        prom.stop()
