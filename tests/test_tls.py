"""TLS on both ports and mTLS on gRPC (issue 14), with real certificates made
in the test by the openssl command-line tool: HTTPS through the OpenAI SDK
trusting the test CA, gRPC over TLS through the Python client, client
certificates required and checked with `--tls-client-ca`, the standalone
`gyre-shim` reaching a TLS service with `--upstream https://...`, plain
text refused cleanly on TLS ports, and bad certificate or key files failing
the start with a message that names the flag."""

from __future__ import annotations

import http.client
import os
import ssl
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx2
import openai
import pytest

import harness
from conftest import QWEN, assert_no_panic

sys.path.insert(0, str(harness.REPO / "clients" / "python"))
from gyre.v1 import generate_pb2 as pb  # noqa: E402
from gyre.v1 import generate_pb2_grpc as pb_grpc  # noqa: E402

LEAF_EXT = "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"


@dataclass
class Pki:
    dir: Path

    def path(self, name: str) -> str:
        return str(self.dir / name)

    def read(self, name: str) -> bytes:
        return (self.dir / name).read_bytes()


def _openssl(cwd: Path, *args: str) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, f"openssl {' '.join(args)}: {done.stderr}"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    """Three CAs (the server's, the clients', a stranger's) and a leaf of each."""
    d = tmp_path_factory.mktemp("pki")
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    for ca in ["ca", "client-ca", "other-ca"]:
        _openssl(d, "req", "-x509", *key, "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "2",
                 "-subj", f"/CN=gyre test {ca}", "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    leaves = {
        "server": ("ca", "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
        "client": ("client-ca", "extendedKeyUsage=clientAuth\n"),
        "stranger": ("other-ca", "extendedKeyUsage=clientAuth\n"),
    }
    for name, (ca, ext) in leaves.items():
        _openssl(d, "req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        (d / f"{name}.ext").write_text(LEAF_EXT + ext)
        _openssl(d, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
                 "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")
    return Pki(d)


def tls_flags(pki: Pki) -> list[str]:
    return ["--tls-cert", pki.path("server.pem"), "--tls-key", pki.path("server.key")]


@pytest.fixture(scope="module")
def tls_server(module_server, pki) -> harness.Server:
    return module_server(QWEN, *tls_flags(pki))


@pytest.fixture(scope="module")
def mtls_server(module_server, pki) -> harness.Server:
    return module_server(QWEN, *tls_flags(pki), "--tls-client-ca", pki.path("client-ca.pem"))


def ca_context(pki: Pki) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=pki.path("ca.pem"))


def sdk(address: str, verify) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"https://{address}/v1", api_key="unused", max_retries=0, timeout=60,
                         http_client=httpx2.Client(verify=verify))


def chat(client: openai.OpenAI) -> str:
    reply = client.chat.completions.create(model=QWEN, messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=3, temperature=0)
    assert reply.usage.completion_tokens > 0
    return reply.choices[0].finish_reason


def grpc_channel(address: str, pki: Pki, client: str | None = None) -> grpc.Channel:
    creds = grpc.ssl_channel_credentials(
        root_certificates=pki.read("ca.pem"),
        private_key=pki.read(f"{client}.key") if client else None,
        certificate_chain=pki.read(f"{client}.pem") if client else None,
    )
    return grpc.secure_channel(address, creds)


def generate(channel: grpc.Channel) -> int:
    stub = pb_grpc.GenerationStub(channel)
    request = pb.Request(text="Hello", max_tokens=3, sampling=pb.SamplingParams(temperature=0.0))
    return sum(len(ev.delta.token_ids) for ev in stub.GenerateStream(request, timeout=60) if ev.HasField("delta"))


def test_https_through_the_openai_sdk(tls_server, pki):
    assert tls_server.scheme == "https"
    # The shim inside `gyre serve` reaches its own TLS gRPC port: a chat
    # completion answered proves the hop too.
    assert chat(sdk(tls_server.http, ca_context(pki)))
    stream = sdk(tls_server.http, ca_context(pki)).chat.completions.create(
        model=QWEN, messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True)
    assert any(c.choices and c.choices[0].finish_reason for c in stream)


def test_https_refuses_a_client_that_does_not_trust_the_ca(tls_server):
    with pytest.raises(openai.APIConnectionError) as caught:
        chat(sdk(tls_server.http, ssl.create_default_context()))
    assert "CERTIFICATE_VERIFY_FAILED" in repr(caught.value.__cause__) or "certificate" in repr(caught.value.__cause__).lower()


def test_grpc_over_tls_through_the_python_client(tls_server, pki):
    with grpc_channel(tls_server.grpc, pki) as channel:
        models = pb_grpc.GenerationStub(channel).ListModels(pb.ListModelsRequest(), timeout=30).models
        assert [m.id for m in models] == [QWEN]
        assert generate(channel) > 0


def _plain_http(address: str) -> None:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=15)
    try:
        conn.request("GET", "/v1/models")
        conn.getresponse().read()
    finally:
        conn.close()


def test_plain_text_to_the_tls_ports_fails_cleanly(tls_server, pki):
    for address in [tls_server.http, tls_server.grpc]:
        with pytest.raises((OSError, http.client.HTTPException)):
            _plain_http(address)
    with grpc.insecure_channel(tls_server.grpc) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            pb_grpc.GenerationStub(channel).ListModels(pb.ListModelsRequest(), timeout=15)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    # Nothing broke: TLS clients are still served.
    with grpc_channel(tls_server.grpc, pki) as channel:
        assert generate(channel) > 0
    assert tls_server.alive()
    assert_no_panic(tls_server)


def test_mtls_accepts_a_client_certificate_of_the_client_ca(mtls_server, pki):
    with grpc_channel(mtls_server.grpc, pki, client="client") as channel:
        assert generate(channel) > 0


@pytest.mark.parametrize("client", [None, "stranger"], ids=["no-certificate", "other-ca"])
def test_mtls_refuses_other_clients(mtls_server, pki, client):
    with grpc_channel(mtls_server.grpc, pki, client=client) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            pb_grpc.GenerationStub(channel).ListModels(pb.ListModelsRequest(), timeout=15)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_mtls_leaves_the_http_api_to_the_in_process_shim(mtls_server, pki):
    """The HTTP port asks no client certificate, and its shim reaches the
    gRPC server in process, outside the gRPC port's mTLS."""
    assert chat(sdk(mtls_server.http, ca_context(pki)))


def start_shim(*flags: str) -> harness.Server:
    return harness.Server.start([str(harness.SHIM_BIN), "--http-addr", "127.0.0.1:0", *flags], want=("HTTP",))


def test_standalone_shim_reaches_a_tls_service(tls_server, pki):
    shim = start_shim("--upstream", f"https://{tls_server.grpc}", "--upstream-ca", pki.path("ca.pem"),
                      *tls_flags(pki))
    try:
        assert shim.scheme == "https"
        assert chat(sdk(shim.http, ca_context(pki)))
    finally:
        shim.stop()
        assert_no_panic(shim)
        shim.remove_log()


@pytest.mark.parametrize("client", [None, "client"], ids=["without-client-cert", "with-client-cert"])
def test_standalone_shim_and_mtls(mtls_server, pki, client):
    flags = ["--upstream-client-cert", pki.path("client.pem"), "--upstream-client-key", pki.path("client.key")] \
        if client else []
    shim = start_shim("--upstream", f"https://{mtls_server.grpc}", "--upstream-ca", pki.path("ca.pem"), *flags)
    try:
        reply = harness.http_json(shim.http, "/v1/completions", {"model": QWEN, "prompt": "Hi", "max_tokens": 2})
        if client:
            assert reply.status == 200, reply.body
        else:
            assert reply.status == 503, reply.body
            assert reply.json()["error"]["code"] == "upstream_unavailable"
    finally:
        shim.stop()
        shim.remove_log()


def _start_fails(argv: list[str]) -> str:
    env = {**os.environ, "XDG_DATA_HOME": tempfile.mkdtemp(prefix="gyre-data-")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=harness.REPO,
                          stdin=subprocess.DEVNULL)
    assert done.returncode != 0, f"{argv} started: {done.stdout}"
    assert "panicked" not in done.stderr
    return done.stderr


def serve_argv(*flags: str) -> list[str]:
    return [str(harness.GYRE_BIN), "serve", "--model", str(harness.model_dir(QWEN)),
            "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", *flags]


def test_bad_certificate_or_key_files_fail_the_start(pki):
    missing = pki.path("missing.pem")
    err = _start_fails(serve_argv("--tls-cert", missing, "--tls-key", pki.path("server.key")))
    assert "--tls-cert" in err and missing in err and "cannot read" in err
    err = _start_fails(serve_argv("--tls-cert", pki.path("server.pem"), "--tls-key", pki.path("server.pem")))
    assert "--tls-key" in err and "no PEM private key" in err
    err = _start_fails(serve_argv("--tls-cert", pki.path("server.key"), "--tls-key", pki.path("server.key")))
    assert "--tls-cert" in err and "no PEM certificate" in err
    err = _start_fails(serve_argv("--tls-cert", pki.path("server.pem"), "--tls-key", pki.path("client.key")))
    assert "--tls-cert and --tls-key" in err
    err = _start_fails(serve_argv("--tls-cert", pki.path("server.pem")))
    assert "--tls-key" in err
    err = _start_fails(serve_argv(*tls_flags(pki), "--tls-client-ca", missing))
    assert "--tls-client-ca" in err and "cannot read" in err
    err = _start_fails([str(harness.SHIM_BIN), "--upstream", "https://127.0.0.1:1", "--http-addr", "127.0.0.1:0"])
    assert "--upstream-ca" in err
