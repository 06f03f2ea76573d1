"""`--quant-activations`: how the CPU's quantized kernels take their
activations, on the real SmolLM2-135M-Instruct Q4_1 GGUF.

Each mode is served in turn. Each scores a fixed text (its prompt
log-probabilities from `/v1/completions` with `echo` and `logprobs`), and
the scores are compared with the same server run with `--dequantize`: the
same weight values in f32, multiplied in f32.
- The default `int8-residual` must be nearer that reference than `int8`
  (llama.cpp's rounding of each block to int8).
- Both must stay close to it.
- With the default, the greedy answer to the France question names Paris.
  With `int8` it need not: on this file the first answer token is a near
  tie that int8 rounding flips. llama.cpp's `llama-server`, which rounds
  the same way, answered "L'Étoile, la Marseillaise, ..." when tried.

A value that is not a mode is refused with an error that lists the modes.
"""

from __future__ import annotations

import subprocess

import harness

GGUF = "smollm2-135m-instruct.gguf"
TEXT = ("The river that runs past the old mill is never the same river twice, but the "
        "people who live along its banks speak of it as if it were a single, patient "
        "creature. In spring it rises with the melting snow from the hills, brown and "
        "quick, carrying branches and the occasional lost fence post down toward the lake.")


def model_id(server: harness.Server) -> str:
    reply = harness.http_json(server.http, "/v1/models")
    assert reply.status == 200, reply.body
    return reply.json()["data"][0]["id"]


def scored(*args: str) -> tuple[list[float], str]:
    """The text's prompt log-probabilities, and the greedy answer to the
    France question, from a server started with `args`."""
    server = harness.serve(GGUF, *args)
    try:
        model = model_id(server)
        reply = harness.http_json(server.http, "/v1/completions", {
            "model": model, "prompt": TEXT, "max_tokens": 1, "temperature": 0,
            "echo": True, "logprobs": 0})
        assert reply.status == 200, reply.body
        lps = reply.json()["choices"][0]["logprobs"]["token_logprobs"]
        # The first prompt token has none; the last entry is the new token.
        assert lps[0] is None and len(lps) > 40
        prompt = lps[1:-1]
        chat = harness.http_json(server.http, "/v1/chat/completions", {
            "model": model, "temperature": 0, "max_tokens": 24,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]})
        assert chat.status == 200, chat.body
        answer = chat.json()["choices"][0]["message"]["content"]
    finally:
        server.stop()
        log = server.stderr()
        server.remove_log()
    assert "panicked" not in log, log[-4000:]
    return prompt, answer


def mean_gap(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return sum(abs(x - y) for x, y in zip(a, b)) / len(a)


def test_modes_against_the_f32_weights():
    reference, _ = scored("--dequantize")
    residual, answer = scored()
    int8, _ = scored("--quant-activations", "int8")
    f32, _ = scored("--quant-activations", "f32")
    gap_residual, gap_int8 = mean_gap(residual, reference), mean_gap(int8, reference)
    gap_f32 = mean_gap(f32, reference)
    print(f"mean |logprob - f32 weights'|: int8-residual {gap_residual:.5f}, int8 {gap_int8:.5f}, "
          f"f32 activations {gap_f32:.5f} over {len(reference)} tokens")
    assert gap_int8 > 0, "int8 activations changed nothing: is the flag applied?"
    assert gap_residual < gap_int8, (gap_residual, gap_int8)
    assert gap_residual < 0.01, gap_residual
    assert gap_int8 < 0.1, gap_int8
    assert gap_f32 < 0.01, gap_f32
    assert "Paris" in answer, answer


def test_an_unknown_mode_is_refused():
    r = subprocess.run([str(harness.GYRE_BIN), "serve", "--quant-activations", "int4"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "int4" in r.stderr and "int8-residual" in r.stderr, r.stderr
