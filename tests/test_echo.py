"""`echo` on /v1/completions: the prompt comes back at the start of each
choice's text (whole, and as each choice's first stream chunk), for text and
token-id prompts and n > 1; with `logprobs`, the prompt's tokens are listed
too (the first with null entries, as OpenAI does), their log-probabilities
equal transformers' log-softmax on the same weights, and `text_offset` runs on
continuously from the prompt into the completion. A prompt already in the
prefix cache still gets every prompt log-probability (gRPC `prompt_logprobs`
skips the cache). Everything validates against the official schemas."""

import base64

import torch
from transformers import AutoModelForCausalLM

import harness
import openai_schema as spec

MODEL = "tiny-qwen2"
PROMPT = [9707, 11, 1879, 0, 576, 6722, 315, 9625]
STEPS = 6


def completion(server, **body) -> dict:
    reply = harness.http_json(server.http, "/v1/completions", {"model": MODEL, **body})
    assert reply.status == 200, reply.body
    out = reply.json()
    spec.validate(spec.COMPLETION, out)
    return out


def streamed(server, **body) -> tuple[dict[int, list[dict]], list[dict]]:
    """Per choice index, its chunks' choice objects in order; and all chunks."""
    sse = harness.http_sse(server.http, "/v1/completions", {"model": MODEL, "stream": True, **body})
    assert sse.status == 200 and sse.done, sse.raw[-500:]
    per: dict[int, list[dict]] = {}
    for chunk in sse.chunks():
        spec.validate(spec.COMPLETION_CHUNK, chunk)
        for c in chunk["choices"]:
            per.setdefault(c["index"], []).append(c)
    return per, sse.chunks()


def test_echo_prepends_the_prompt(client, qwen):
    args = dict(model=MODEL, prompt="Once upon a time", max_tokens=STEPS, temperature=0,
                extra_body={"ignore_eos": True})
    plain = client.completions.create(**args).choices[0].text
    echoed = client.completions.create(**args, echo=True)
    assert echoed.choices[0].text == "Once upon a time" + plain
    assert echoed.choices[0].logprobs is None
    # Streamed: the prompt is the choice's first chunk, the rest as without echo.
    per, _ = streamed(qwen, prompt="Once upon a time", max_tokens=STEPS, temperature=0, ignore_eos=True, echo=True)
    texts = [c["text"] for c in per[0]]
    assert texts[0] == "Once upon a time"
    assert "".join(texts) == echoed.choices[0].text


def test_echo_of_token_ids_and_batches_with_n(client, qwen):
    decoded = harness.http_json(qwen.http, "/detokenize", {"model": MODEL, "tokens": PROMPT}).json()["prompt"]
    assert decoded
    out = client.completions.create(model=MODEL, prompt=[PROMPT, "Hello there"], n=2, max_tokens=3,
                                    temperature=0, echo=True)
    assert len(out.choices) == 4
    by_index = {c.index: c.text for c in out.choices}
    assert by_index[0].startswith(decoded) and by_index[1].startswith(decoded)
    assert by_index[2].startswith("Hello there") and by_index[3].startswith("Hello there")
    # Usage counts the prompts once per prompt, as without echo; the rest is the
    # same (greedy) output as without echo.
    plain = client.completions.create(model=MODEL, prompt=[PROMPT, "Hello there"], n=2, max_tokens=3,
                                      temperature=0)
    assert out.usage.prompt_tokens == plain.usage.prompt_tokens
    assert {c.index: c.text for c in plain.choices} == {i: t[len(decoded if i < 2 else "Hello there"):]
                                                        for i, t in by_index.items()}


def check_listing(lp: dict, prompt_ids: list[int], completion_len: int, text: str) -> None:
    n = len(prompt_ids) + completion_len
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(isinstance(x, float) for x in lp["token_logprobs"][1:])
    # Offsets run on continuously from the prompt into the completion.
    assert lp["text_offset"][0] == 0
    for i in range(1, n):
        assert lp["text_offset"][i] == lp["text_offset"][i - 1] + len(lp["tokens"][i - 1]), i
    assert "".join(lp["tokens"]) == text


def test_echo_with_logprobs_matches_transformers(qwen):
    body = dict(prompt=PROMPT, max_tokens=STEPS, temperature=0, ignore_eos=True, logprobs=3, echo=True)
    out = completion(qwen, **body)
    choice = out["choices"][0]
    lp = choice["logprobs"]
    check_listing(lp, PROMPT, STEPS, choice["text"])
    # The completion's ids through gRPC, then transformers along prompt + completion.
    req = {"tokenIds": {"ids": PROMPT}, "maxTokens": STEPS, "ignoreEos": True, "sampling": {"temperature": 0}}
    events = harness.buf_curl(qwen.grpc, "gyre.v1.Generation/GenerateStream", req).ok().messages
    ids = [int(t) for e in events if "delta" in e for t in e["delta"].get("tokenIds", [])]
    full = PROMPT + ids
    model = AutoModelForCausalLM.from_pretrained(harness.model_dir(MODEL), dtype=torch.float32)
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([full])).logits[0].double(), dim=-1)
    for pos in range(1, len(full)):
        row = ref[pos - 1]
        assert abs(float(row[full[pos]]) - lp["token_logprobs"][pos]) < 1e-4, pos
        assert len(lp["top_logprobs"][pos]) == 3
        best = max(lp["top_logprobs"][pos].values())
        assert abs(best - float(row.max())) < 1e-4, pos
    # Streamed: the same listing, split across the echo chunk and the rest.
    per, _ = streamed(qwen, **body)
    tokens, logprobs, offsets, text = [], [], [], ""
    for c in per[0]:
        text += c["text"]
        if c.get("logprobs"):
            tokens += c["logprobs"]["tokens"]
            logprobs += c["logprobs"]["token_logprobs"]
            offsets += c["logprobs"]["text_offset"]
    assert per[0][0]["logprobs"]["tokens"] == lp["tokens"][:len(PROMPT)]
    assert (tokens, offsets, text) == (lp["tokens"], lp["text_offset"], choice["text"])
    assert logprobs[0] is None
    assert all(abs(a - b) < 1e-6 for a, b in zip(logprobs[1:], lp["token_logprobs"][1:]))


def test_prompt_logprobs_ignore_the_prefix_cache(qwen):
    # 40 tokens: two full KV blocks that the first request leaves in the cache.
    prompt = (PROMPT * 5)[:40]
    first = completion(qwen, prompt=prompt, max_tokens=1, temperature=0, cache_salt="echo-test")
    again = completion(qwen, prompt=prompt, max_tokens=1, temperature=0, cache_salt="echo-test")
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= 32, "the prompt is cached"
    echoed = completion(qwen, prompt=prompt, max_tokens=1, temperature=0, cache_salt="echo-test",
                        echo=True, logprobs=0)
    assert echoed["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    lp = echoed["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == 41 and None not in lp["token_logprobs"][1:]
    assert lp["top_logprobs"][1:] == [{}] * 40
    assert first["choices"][0]["text"] == again["choices"][0]["text"] == echoed["choices"][0]["text"][-len(
        first["choices"][0]["text"]):]


def test_prompt_logprobs_over_grpc(qwen):
    req = {"tokenIds": {"ids": PROMPT}, "maxTokens": 2, "n": 2, "promptLogprobs": 1,
           "sampling": {"temperature": 0}}
    events = harness.buf_curl(qwen.grpc, "gyre.v1.Generation/GenerateStream", req).ok().messages
    prompts = [e for e in events if "prompt" in e]
    assert sorted(e.get("index", 0) for e in prompts) == [0, 1], "one per choice"
    for e in prompts:
        p = e["prompt"]
        assert [int(t) for t in p["tokenIds"]] == PROMPT
        assert [int(x.get("tokenId", 0)) for x in p["logprobs"]] == PROMPT[1:]
        assert all(len(x["topLogprobs"]) == 1 for x in p["logprobs"])
        assert p["firstToken"] and p["text"]
        first_delta = next(i for i, x in enumerate(events) if "delta" in x and x.get("index", 0) == e.get("index", 0))
        assert events.index(e) < first_delta, "the prompt comes before the choice's deltas"
    bad = harness.buf_curl(qwen.grpc, "gyre.v1.Generation/GenerateStream", {**req, "promptLogprobs": 21})
    assert bad.rc != 0 and bad.error["code"] == "invalid_argument"


def test_sentencepiece_token_strings_add_up_to_the_text(model_server):
    """A SentencePiece tokenizer (tiny-mistral's) drops a word's leading space
    from a token decoded alone ("▁capital" read "capital"); each string of a
    listing is the token's text after the tokens before it, as in llama.cpp's
    server and vLLM, so the strings add up to the text and `text_offset`
    counts into it: echoed prompt and completion, whole and streamed, and
    chat's `logprobs.content` adds up to the message."""
    model = "tiny-mistral"
    server = model_server(model)
    body = dict(model=model, prompt="The capital of France is", max_tokens=STEPS, temperature=0,
                ignore_eos=True, logprobs=2, echo=True)
    reply = harness.http_json(server.http, "/v1/completions", body)
    assert reply.status == 200, reply.body
    out = reply.json()
    spec.validate(spec.COMPLETION, out)
    choice = out["choices"][0]
    lp = choice["logprobs"]
    assert "".join(lp["tokens"]) == choice["text"]
    assert lp["text_offset"] == [len("".join(lp["tokens"][:i])) for i in range(len(lp["tokens"]))]
    assert " capital" in lp["tokens"] and " France" in lp["tokens"], lp["tokens"]
    # Greedy: each output token is its position's most likely, listed
    # among the alternatives under the same string.
    for i in range(len(lp["tokens"]) - STEPS, len(lp["tokens"])):
        assert lp["tokens"][i] in lp["top_logprobs"][i], (i, lp["tokens"][i], lp["top_logprobs"][i])
    sse = harness.http_sse(server.http, "/v1/completions", {**body, "stream": True})
    assert sse.status == 200 and sse.done, sse.raw[-500:]
    tokens, text = [], ""
    for chunk in sse.chunks():
        for c in chunk["choices"]:
            text += c["text"]
            tokens += (c.get("logprobs") or {}).get("tokens", [])
    assert (tokens, text) == (lp["tokens"], choice["text"])
    chat = {"model": model, "messages": [{"role": "user", "content": "Name three colours."}],
            "max_tokens": STEPS, "temperature": 0, "ignore_eos": True, "logprobs": True, "top_logprobs": 2}
    reply = harness.http_json(server.http, "/v1/chat/completions", chat)
    assert reply.status == 200, reply.body
    c = reply.json()["choices"][0]
    content = c["logprobs"]["content"]
    assert "".join(e["token"] for e in content) == c["message"]["content"]
    assert b"".join(bytes(e["bytes"]) for e in content) == c["message"]["content"].encode()


def test_token_bytes_add_up_where_characters_split(model_server):
    """Where a character is split across tokens (byte-fallback bytes on
    tiny-mistral, partial byte-level pieces on tiny-qwen2), each token's
    string holds U+FFFD, and its bytes are the part's own: the prompt
    listing's bytes over gRPC add up to the prompt's UTF-8."""
    text = "Tea 🍵 and 日本語, naïve café 🙂 ok"
    for model in ("tiny-mistral", "tiny-qwen2"):
        server = model_server(model)
        reply = harness.http_json(server.http, "/tokenize",
                                  {"model": model, "prompt": text, "add_special_tokens": False})
        assert reply.status == 200, reply.body
        ids = reply.json()["tokens"]
        req = {"model": model, "tokenIds": {"ids": ids}, "maxTokens": 1, "promptLogprobs": 0,
               "sampling": {"temperature": 0}}
        events = harness.buf_curl(server.grpc, "gyre.v1.Generation/GenerateStream", req).ok().messages
        prompt = next(e["prompt"] for e in events if "prompt" in e)
        listing = prompt["logprobs"]
        assert [int(x.get("tokenId", 0)) for x in listing] == ids[1:]
        tokens = [x.get("token", "") for x in listing]
        assert any("\ufffd" in t for t in tokens), (model, tokens)
        got = b"".join(base64.b64decode(x.get("tokenBytes", "")) for x in listing)
        first = prompt["firstToken"].encode()
        assert first + got == text.encode(), (model, got)
