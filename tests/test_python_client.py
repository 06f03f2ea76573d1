"""The Python client package (`clients/python`, `gyre-client`) against a live
gyre serving the real default model (SmolLM2-135M-Instruct).

The package is built the way a user gets it: from a copy of the checkout
without any generated file (a fresh clone: clients/python and proto/),
installed with `pip install --target` (no build isolation: the build needs
setuptools and grpcio-tools, both in the project's venv), and imported from
there. Its sdist is built too and must carry the generated modules and the
proto files, so a wheel built from it alone (no checkout around) has them.

Then every helper runs against the server: greedy `generate` equals the
answer of the HTTP API to the same request, `stream`'s pieces join to it,
a `session` multiplexes two requests on one `Generate` stream and cancels
one, `chat`, `tokenize`, `models`, `stats` and `health` agree with the
server's other paths, errors arrive as `GyreError` with the status code and
the ErrorInfo reason, and a server with `--api-key` refuses calls without
the key (UNAUTHENTICATED) and serves them with it; over TLS with a client
certificate (mTLS, certificates made here with openssl) the client connects
with `TLS(ca, cert, key)` and is refused without its certificate or
without TLS. The asyncio client runs the same generation, stream, session
and error checks.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

import harness
from conftest import API_KEY, QWEN, assert_no_panic

PKG = harness.REPO / "clients" / "python"
GGUF = "smollm2-135m-instruct.gguf"
MODEL = "smollm2-135m-instruct"
PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
GENERATED = ("gyre/v1/generate_pb2.py", "gyre/v1/generate_pb2_grpc.py", "gyre/v1/generate_pb2.pyi",
             "gyre/v1/admin_pb2.py", "gyre_client/_wire_pb2.py")
# What a build leaves in the source tree (and `make clients` writes): not in a fresh clone.
NOT_IN_CLONE = shutil.ignore_patterns("gyre", "_wire_pb2.py*", "build", "dist", "*.egg-info", "__pycache__", "proto")


def pip(*args: str, cwd: Path | None = None) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"pip {' '.join(args)}:\n{done.stdout}\n{done.stderr}"


def fresh_clone(root: Path) -> Path:
    """clients/python and proto/ as a clone has them (no generated modules)."""
    shutil.copytree(PKG, root / "clients" / "python", ignore=NOT_IN_CLONE)
    shutil.copytree(harness.REPO / "proto" / "gyre", root / "proto" / "gyre")
    assert not (root / "clients" / "python" / "gyre").exists()
    return root / "clients" / "python"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """`pip install ./clients/python` from a fresh clone, into a target dir."""
    root = tmp_path_factory.mktemp("clone")
    target = tmp_path_factory.mktemp("site")
    fresh_clone(root)
    pip("install", "--no-deps", "--no-build-isolation", "--no-index", "--target", str(target), "./clients/python",
        cwd=root)
    return target


@pytest.fixture(scope="module")
def gc(installed):
    """The `gyre_client` module, imported from the installed package."""
    sys.path.insert(0, str(installed))
    import gyre_client

    assert Path(gyre_client.__file__).is_relative_to(installed), gyre_client.__file__
    return gyre_client


@pytest.fixture(scope="module")
def smol(module_server) -> harness.Server:
    return module_server(GGUF)


@pytest.fixture(scope="module")
def client(gc, smol):
    with gc.Client(smol.grpc, timeout=120) as c:
        yield c


def http_completion(server: harness.Server, **body) -> dict:
    r = harness.http_json(server.http, "/v1/completions", {"model": MODEL, "temperature": 0, **body})
    assert r.status == 200, r.body
    return r.json()


# ---------------------------------------------------------------------------
# Packaging


def test_the_installed_package_holds_the_generated_modules(installed):
    for name in GENERATED:
        assert (installed / name).is_file(), f"{name} missing from the installed package"
    # A clean interpreter finds everything in the target dir alone.
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import gyre_client, gyre.v1.generate_pb2 as g; "
            "print(gyre_client.__file__); print(g.__file__)")
    done = subprocess.run([sys.executable, "-I", "-c", code, str(installed)], capture_output=True, text=True,
                          timeout=60, cwd=installed)
    assert done.returncode == 0, done.stderr
    for line in done.stdout.split():
        assert Path(line).is_relative_to(installed), line


def test_the_sdist_carries_proto_and_generated_modules_and_builds_alone(tmp_path):
    pkg = fresh_clone(tmp_path / "clone")
    build = ("import sys; from setuptools import build_meta as b; "
             "print(b.build_sdist(sys.argv[1]))")
    done = subprocess.run([sys.executable, "-c", build, str(tmp_path / "sdist")], cwd=pkg, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    [sdist] = (tmp_path / "sdist").glob("gyre_client-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        tar.extractall(tmp_path / "unpacked", filter="data")
    for name in (*GENERATED, "proto/gyre/v1/generate.proto", "proto/gyre/v1/admin.proto", "generate.py"):
        assert name in names, f"{name} missing from the sdist"
    assert not any(n.endswith(".rs") for n in names)
    # The wheel built from the sdist alone, far from any checkout.
    [src] = (tmp_path / "unpacked").iterdir()
    shutil.rmtree(src / "gyre")
    pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp_path / "wheel"), str(src))
    [wheel] = (tmp_path / "wheel").glob("gyre_client-*.whl")
    with zipfile.ZipFile(wheel) as z:
        members = set(z.namelist())
    for name in GENERATED:
        assert name in members, f"{name} missing from the wheel built from the sdist"


# ---------------------------------------------------------------------------
# Against the live server


def test_generate_greedy_equals_the_http_api(client, smol):
    r = client.generate(PROMPT, max_tokens=16, temperature=0)
    ref = http_completion(smol, prompt=PROMPT, max_tokens=16)
    assert r.text == ref["choices"][0]["text"]
    assert r.text.strip()
    assert r.finish_reason == ref["choices"][0]["finish_reason"]
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == \
        (ref["usage"]["prompt_tokens"], ref["usage"]["completion_tokens"])
    assert len(r.token_ids) == r.usage.completion_tokens
    assert r.model == MODEL
    # The same prompt given as token ids, and the ids decoded back.
    ids = client.tokenize(PROMPT).ids
    assert client.generate(list(ids), max_tokens=16, temperature=0).text == r.text
    assert client.detokenize(r.token_ids) == r.text


def test_stream_pieces_join_to_the_generated_text(client):
    whole = client.generate(PROMPT, max_tokens=16, temperature=0)
    s = client.stream(PROMPT, max_tokens=16, temperature=0)
    chunks = list(s)
    assert len(chunks) > 1, chunks
    assert "".join(c.text for c in chunks) == whole.text
    assert tuple(t for c in chunks for t in c.token_ids) == whole.token_ids
    assert s.completion is not None and s.completion.usage == whole.usage
    assert s.completion.finish_reason == whole.finish_reason


def test_leaving_a_stream_early_cancels_it(gc, client):
    with client.stream("Story:", max_tokens=4000, ignore_eos=True) as s:
        it = iter(s)
        first = next(it)
    assert first.token_ids
    with pytest.raises(gc.GyreError) as e:
        next(it)
    assert e.value.code.name == "CANCELLED"
    assert s.completion is None
    # The engine lets the generation go (a bounded wait).
    deadline = time.monotonic() + 20
    while (st := client.stats()).running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert st.running == 0 and st.kv_blocks_used == 0, st
    with pytest.raises(ValueError):
        client.generate(PROMPT, n=2)


def test_chat_equals_the_http_chat_completion(client, smol):
    r = client.chat(MESSAGES, max_tokens=24, temperature=0)
    ref = harness.http_json(smol.http, "/v1/chat/completions",
                            {"model": MODEL, "messages": MESSAGES, "max_tokens": 24, "temperature": 0})
    assert ref.status == 200, ref.body
    assert r.text == ref.json()["choices"][0]["message"]["content"]
    assert "Paris" in r.text
    assert r.usage.prompt_tokens == ref.json()["usage"]["prompt_tokens"]


def test_session_multiplexes_two_requests_and_cancels_one(gc, client):
    expected = client.generate("One, two, three,", max_tokens=10, temperature=0)
    with client.session() as s:
        a = s.submit("One, two, three,", max_tokens=10, temperature=0)
        b = s.submit("Story:", max_tokens=4000, ignore_eos=True, request_id="long")
        with pytest.raises(gc.GyreError) as dup:
            s.submit("again", request_id="long")
        first = next(iter(b))
        b.cancel()
        done_b = b.result()
        done_a = a.result()
    assert dup.value.code.name == "ALREADY_EXISTS"
    assert first.token_ids
    assert done_b.finish_reason == "cancelled"
    assert done_b.request_id == "long"
    assert done_b.usage.completion_tokens < 4000
    assert done_b.text.startswith(first.text)
    assert done_a.finish_reason == "length"
    assert done_a.text == expected.text
    assert done_a.request_id != done_b.request_id


def test_a_session_request_that_fails_raises_and_the_others_carry_on(gc, client):
    with client.session() as s:
        bad = s.submit(PROMPT, model="no-such-model", max_tokens=4)
        good = s.submit(PROMPT, max_tokens=4, temperature=0)
        with pytest.raises(gc.GyreError) as e:
            bad.result()
        assert good.result().usage.completion_tokens == 4
    assert e.value.code.name == "NOT_FOUND"
    assert e.value.reason == "MODEL_NOT_FOUND"
    assert e.value.request_id == bad.request_id


def test_tokenize_agrees_with_the_http_usage(client, smol):
    t = client.tokenize(PROMPT)
    ref = http_completion(smol, prompt=PROMPT, max_tokens=1)
    assert len(t.ids) == ref["usage"]["prompt_tokens"]
    assert t.prompt == PROMPT
    assert client.detokenize(t.ids) == PROMPT
    chat = client.tokenize(messages=MESSAGES)
    assert MESSAGES[0]["content"] in chat.prompt
    assert len(chat.ids) == client.chat(MESSAGES, max_tokens=1).usage.prompt_tokens
    assert t.max_model_len == chat.max_model_len > 0


def test_models_stats_and_health(client, smol):
    models = client.models()
    http = harness.http_json(smol.http, "/v1/models").json()
    assert [m.id for m in models] == [m["id"] for m in http["data"]] == [MODEL]
    assert models[0].vocab_size > 0 and models[0].chat
    before = client.stats()
    client.generate(PROMPT, max_tokens=4, ignore_eos=True)
    # Counters are as of the engine's last step, which may be published just
    # after the finish went out: poll (a bounded wait, not a timing check).
    deadline = time.monotonic() + 20
    while (after := client.stats(MODEL)).generated_tokens_total < before.generated_tokens_total + 4 \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert after.model == MODEL
    assert after.kv_blocks_total > 0
    assert after.generated_tokens_total >= before.generated_tokens_total + 4
    assert client.health() == "SERVING"
    assert client.health(MODEL) == "SERVING"


def test_errors_are_typed_with_code_and_reason(gc, client):
    for call in (lambda: client.generate(PROMPT, model="no-such-model"),
                 lambda: list(client.stream(PROMPT, model="no-such-model")),
                 lambda: client.tokenize(PROMPT, model="no-such-model"),
                 lambda: client.stats("no-such-model")):
        with pytest.raises(gc.GyreError) as e:
            call()
        assert e.value.code.name == "NOT_FOUND", e.value
        assert e.value.reason == "MODEL_NOT_FOUND", e.value
        assert "no-such-model" in e.value.message
    with pytest.raises(gc.GyreError) as e:
        client.generate(PROMPT, temperature=5.0)
    assert e.value.code.name == "INVALID_ARGUMENT"
    assert e.value.field and "temperature" in e.value.field, vars(e.value)


def test_api_key(gc, keyed):
    with gc.Client(keyed.grpc, timeout=120) as anonymous, \
            gc.Client(keyed.grpc, api_key="not-the-key", timeout=120) as wrong, \
            gc.Client(f"http://{keyed.grpc}", api_key=API_KEY, timeout=120) as right:
        for c in (anonymous, wrong):
            with pytest.raises(gc.GyreError) as e:
                c.models()
            assert e.value.code.name == "UNAUTHENTICATED"
            with pytest.raises(gc.GyreError) as e:
                c.generate("Hi", max_tokens=2)
            assert e.value.code.name == "UNAUTHENTICATED"
        # Health needs no key.
        assert anonymous.health() == "SERVING"
        assert right.models()
        assert right.generate("Hi", max_tokens=2, ignore_eos=True).usage.completion_tokens == 2
        with right.session() as s:
            assert s.submit("Hi", max_tokens=2, ignore_eos=True).result().usage.completion_tokens == 2


def openssl(cwd: Path, *args: str) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"openssl {' '.join(args)}: {done.stderr}"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """A server CA and a client CA (self-signed), a server leaf for 127.0.0.1 and a client leaf."""
    d = tmp_path_factory.mktemp("pki")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    for ca in ("server-ca", "client-ca"):
        openssl(d, "req", "-x509", *ec, "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "2",
                "-subj", f"/CN=gyre-client test {ca}", "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign")
    for leaf, ca, ext in (("server", "server-ca", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
                          ("client", "client-ca", "extendedKeyUsage=clientAuth\n")):
        openssl(d, "req", *ec, "-keyout", f"{leaf}.key", "-out", f"{leaf}.csr", "-subj", f"/CN={leaf}")
        (d / f"{leaf}.ext").write_text("basicConstraints=CA:FALSE\n" + ext)
        openssl(d, "x509", "-req", "-in", f"{leaf}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
                "-CAcreateserial", "-out", f"{leaf}.pem", "-days", "2", "-extfile", f"{leaf}.ext")
    return d


def test_tls_with_a_client_certificate(gc, module_server, pki):
    server = module_server(QWEN, "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"),
                           "--tls-client-ca", str(pki / "client-ca.pem"))
    assert server.scheme == "https"
    mtls = gc.TLS(ca=pki / "server-ca.pem", cert=str(pki / "client.pem"), key=(pki / "client.key").read_bytes())
    with gc.Client(server.grpc, tls=mtls, timeout=60) as c:
        assert [m.id for m in c.models()] == [QWEN]
        assert c.generate("Hi", max_tokens=3, ignore_eos=True).usage.completion_tokens == 3

    async def run_async():
        async with gc.AsyncClient(f"https://{server.grpc}", tls=mtls, timeout=60) as c:
            return (await c.generate("Hi", max_tokens=3, ignore_eos=True)).usage.completion_tokens

    assert asyncio.run(run_async()) == 3
    # Without a client certificate, and without TLS.
    for refused in (gc.TLS(ca=pki / "server-ca.pem"), None):
        with gc.Client(server.grpc, tls=refused, timeout=20) as c:
            with pytest.raises(gc.GyreError) as e:
                c.models()
            assert e.value.code.name == "UNAVAILABLE", e.value
    # A certificate only verifies against the CA that signed it.
    with gc.Client(server.grpc, tls=gc.TLS(ca=pki / "client-ca.pem", cert=pki / "client.pem",
                                           key=pki / "client.key"), timeout=20) as c:
        with pytest.raises(gc.GyreError) as e:
            c.models()
        assert e.value.code.name == "UNAVAILABLE", e.value
    assert_no_panic(server)


def test_async_client(gc, client, smol):
    whole = client.generate(PROMPT, max_tokens=16, temperature=0)

    async def run():
        async with gc.AsyncClient(smol.grpc, timeout=120) as c:
            r = await c.generate(PROMPT, max_tokens=16, temperature=0)
            s = c.stream(PROMPT, max_tokens=16, temperature=0)
            chunks = [chunk async for chunk in s]
            chat = await c.chat(MESSAGES, max_tokens=24, temperature=0)
            with pytest.raises(gc.GyreError) as e:
                await c.generate(PROMPT, model="no-such-model")
            async with c.session() as sess:
                a = await sess.submit("One, two, three,", max_tokens=10, temperature=0)
                b = await sess.submit("Story:", max_tokens=4000, ignore_eos=True)
                async for _ in b:
                    await b.cancel()
                done_a, done_b = await a.result(), await b.result()
            extra = (await c.tokenize(PROMPT), await c.models(), await c.stats(), await c.health())
            return r, s, chunks, chat, e.value, done_a, done_b, extra

    r, s, chunks, chat, err, done_a, done_b, (tokens, models, stats, health) = asyncio.run(run())
    assert r.text == whole.text and r.usage == whole.usage
    assert len(chunks) > 1 and "".join(c.text for c in chunks) == whole.text
    assert s.completion.usage == whole.usage
    assert chat.text == client.chat(MESSAGES, max_tokens=24, temperature=0).text
    assert err.code.name == "NOT_FOUND" and err.reason == "MODEL_NOT_FOUND"
    assert done_a.text == client.generate("One, two, three,", max_tokens=10, temperature=0).text
    assert done_b.finish_reason == "cancelled" and done_b.usage.completion_tokens < 4000
    assert tokens.ids == client.tokenize(PROMPT).ids
    assert [m.id for m in models] == [MODEL] and stats.model == MODEL and health == "SERVING"


def test_the_server_survived(smol):
    assert smol.alive()
    assert_no_panic(smol)
