"""LiteLLM (from the compat venv: `make compat`) against a live gyre serving
the real default model (SmolLM2-135M-Instruct), both ways users run it:

- as a library: `litellm.completion(model="openai/<served name>", api_base=...)`
  whole and streamed must give the text, finish reason and usage the project's
  OpenAI SDK gets from gyre directly for the same request (greedy decoding),
  and an unknown model must raise LiteLLM's `NotFoundError` (gyre's 404);
- as a proxy: `litellm --config` routes a model name of its own to gyre, with a
  master key and no database; the OpenAI SDK against the proxy must get gyre's
  text (whole and streamed) and gyre's `system_fingerprint`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

import compat_util as cu

CASES = {  # as in tests/compat/litellm_client.py
    "question": {"messages": [{"role": "user", "content": "What is the capital of France?"}]},
    "poem": {"messages": [{"role": "user", "content": "Write a poem about the sea."}], "max_tokens": 12},
}
PROXY_MODEL = "gyre-smol"
MASTER_KEY = "sk-gyre-compat-test"
PROXY_START_S = 150.0


@pytest.fixture(scope="module")
def server(module_server):
    return module_server(cu.DEFAULT_GGUF)


@pytest.fixture(scope="module")
def direct(server):
    return cu.sdk(f"http://{server.http}/v1")


def reference(direct, stream: bool = False, **kw):
    """gyre's own answer to a case, through the project's OpenAI SDK."""
    return direct.chat.completions.create(model=cu.DEFAULT, temperature=0, stream=stream, **kw)


def joined(chunks) -> tuple[str, str | None, int]:
    """(content, finish_reason, chunks with content) of an SDK stream."""
    content, finish, pieces = "", None, 0
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            pieces += bool(choice.delta.content)
            finish = choice.finish_reason or finish
    return content, finish, pieces


# --- LiteLLM as a library -------------------------------------------------


@pytest.fixture(scope="module")
def library(server) -> dict:
    return cu.run_script("litellm_client.py", f"http://{server.http}/v1", cu.DEFAULT)


def test_versions_are_the_pinned_ones(library):
    assert library["versions"]["litellm"] == cu.pinned("litellm"), library["versions"]
    assert library["versions"]["openai"] == cu.pinned("openai"), library["versions"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_completion_whole_and_streamed_equal_the_sdk(library, direct, case):
    ref = reference(direct, **CASES[case])
    text, finish = ref.choices[0].message.content, ref.choices[0].finish_reason
    assert finish == ("stop" if case == "question" else "length"), ref
    whole, stream = library[case]["whole"], library[case]["stream"]
    assert (whole["content"], whole["finish"]) == (text, finish), (whole, ref)
    assert whole["usage"] == list(cu.usage_counts(ref.usage)), (whole, ref.usage)
    assert (stream["content"], stream["finish"]) == (text, finish), (stream, ref)
    assert sum(1 for p in stream["pieces"] if p) >= 3, stream["pieces"]
    assert stream["usage"] == whole["usage"], stream


def test_unknown_model_raises_litellms_not_found(library, direct):
    with pytest.raises(openai.NotFoundError) as ref:
        direct.chat.completions.create(model="no-such-model", **CASES["question"])
    err = library["error"]
    assert err["class"] == "NotFoundError" and err["not_found"], err
    assert err["status"] == 404, err
    assert ref.value.body["message"] in err["message"], (ref.value.body, err)


# --- LiteLLM as a proxy in front of gyre ----------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="module")
def proxy(server):
    """`litellm --config` on a free loopback port, routing PROXY_MODEL to gyre;
    no database (no DATABASE_URL), the cost map read locally (no network)."""
    litellm_bin = cu.venv_bin("litellm")
    work = Path(tempfile.mkdtemp(prefix="gyre-litellm-"))
    config = work / "config.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {PROXY_MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{cu.DEFAULT}\n"
        f"      api_base: http://{server.http}/v1\n"
        "      api_key: unused\n"
        "general_settings:\n"
        f"  master_key: {MASTER_KEY}\n"
        "litellm_settings:\n"
        "  num_retries: 0\n"
        "  request_timeout: 120\n")
    port = free_port()
    log_path = work / "proxy.log"
    env = {k: v for k, v in cu.tool_env().items() if k != "DATABASE_URL"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(litellm_bin), "--config", str(config), "--host", "127.0.0.1",
                                 "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=work, env=env, start_new_session=True)

    def stop() -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def log_tail() -> str:
        return log_path.read_text(errors="replace")[-4000:]

    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + PROXY_START_S
    while not alive(f"{url}/health/liveliness"):
        if proc.poll() is not None or time.monotonic() > deadline:
            why = f"exited with {proc.returncode}" if proc.poll() is not None else f"not up in {PROXY_START_S:.0f}s"
            stop()
            pytest.fail(f"the LiteLLM proxy {why}; its log:\n{log_tail()}", pytrace=False)
        time.sleep(0.5)
    yield url, log_tail
    stop()
    assert proc.returncode is not None
    for p in work.iterdir():
        p.unlink()
    work.rmdir()


@pytest.fixture(scope="module")
def via_proxy(proxy):
    return cu.sdk(f"{proxy[0]}/v1", api_key=MASTER_KEY)


@pytest.mark.parametrize("case", sorted(CASES))
def test_proxy_chat_whole_returns_gyres_answer(via_proxy, direct, case):
    ref = reference(direct, **CASES[case])
    r = via_proxy.chat.completions.create(model=PROXY_MODEL, temperature=0, **CASES[case])
    assert r.choices[0].message.content == ref.choices[0].message.content, (r, ref)
    assert r.choices[0].finish_reason == ref.choices[0].finish_reason, (r, ref)
    assert cu.usage_counts(r.usage) == cu.usage_counts(ref.usage), (r.usage, ref.usage)
    # gyre's fingerprint passed through: the answer came from gyre.
    assert ref.system_fingerprint and r.system_fingerprint == ref.system_fingerprint, (r, ref)


@pytest.mark.parametrize("case", sorted(CASES))
def test_proxy_chat_streamed_returns_gyres_answer(via_proxy, direct, case):
    ref = reference(direct, **CASES[case])
    content, finish, pieces = joined(via_proxy.chat.completions.create(
        model=PROXY_MODEL, temperature=0, stream=True, **CASES[case]))
    assert (content, finish) == (ref.choices[0].message.content, ref.choices[0].finish_reason), (content, ref)
    assert pieces >= 3, pieces
    # gyre's own stream spells the same text.
    assert joined(reference(direct, stream=True, **CASES[case]))[0] == content

