"""The official `openai` Python SDK's async client (`AsyncOpenAI`) against
`gyre serve` (tiny-qwen2), the row of the compatibility matrix that the sync
tests (test_openai_sdk.py) leave out.

What an asyncio application relies on: awaited chat, completions and
Responses calls giving what the sync client gives; many requests in flight
at once on one client, each answered as if it were alone (the engine batches
them; greedy rows are batch-invariant); `async for` over a stream, whose
pieces join to the whole answer and whose last chunk carries usage; the
async streaming helpers (`chat.completions.stream`, `responses.stream`);
typed errors raised from awaits; and a stream closed early (`await
stream.close()`) letting the engine stop the request and free its blocks.
"""

from __future__ import annotations

import asyncio
import time

import openai
import pytest

import harness
from conftest import QWEN

PROMPTS = [
    "Write one sentence about the sea.",
    "Name three colours.",
    "What is two plus two?",
    "Describe a cat in five words.",
    "Say hello in French.",
    "List the days of the week.",
    "Why is the sky blue?",
    "Count from one to five.",
]
MAX_TOKENS = 12
#: tiny-qwen2's end-of-sequence tokens, banned so that a generation runs on.
NO_EOS = {"151645": -100, "151643": -100}


@pytest.fixture(scope="module")
def base_url(qwen) -> str:
    return f"http://{qwen.http}/v1"


def run(coro_fn, base_url: str):
    """Runs `coro_fn(client)` on a fresh AsyncOpenAI client in its own event loop."""

    async def main():
        async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120) as c:
            return await coro_fn(c)

    return asyncio.run(main())


def messages(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def stats(server: harness.Server) -> dict:
    [s] = harness.buf_curl(server.grpc, "gyre.v1.Generation/GetStats", {"model": QWEN}).ok().messages
    return s


def test_awaited_calls_equal_the_sync_clients(client, base_url):
    sync_chat = client.chat.completions.create(
        model=QWEN, messages=messages(PROMPTS[0]), max_tokens=MAX_TOKENS, temperature=0)
    sync_text = client.completions.create(model=QWEN, prompt="The capital of France is",
                                          max_tokens=MAX_TOKENS, temperature=0)

    async def calls(c):
        chat = await c.chat.completions.create(
            model=QWEN, messages=messages(PROMPTS[0]), max_tokens=MAX_TOKENS, temperature=0)
        text = await c.completions.create(model=QWEN, prompt="The capital of France is",
                                          max_tokens=MAX_TOKENS, temperature=0)
        models = await c.models.list()
        return chat, text, [m.id async for m in models]

    chat, text, ids = run(calls, base_url)
    assert chat.choices[0].message.content == sync_chat.choices[0].message.content
    # Equal counts (the second asker's prompt may come from the prefix cache).
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens) == (
        sync_chat.usage.prompt_tokens, sync_chat.usage.completion_tokens)
    assert text.choices[0].text == sync_text.choices[0].text
    assert chat.choices[0].message.content and text.choices[0].text
    assert QWEN in ids


def test_concurrent_requests_are_each_answered_as_alone(client, base_url):
    """Eight requests gathered on one client: the engine runs them together,
    and each greedy answer equals the same request sent alone."""
    alone = [client.chat.completions.create(model=QWEN, messages=messages(p), max_tokens=MAX_TOKENS,
                                            temperature=0, logit_bias=NO_EOS).choices[0].message.content
             for p in PROMPTS]

    async def gathered(c):
        rs = await asyncio.gather(*[
            c.chat.completions.create(model=QWEN, messages=messages(p), max_tokens=MAX_TOKENS,
                                      temperature=0, logit_bias=NO_EOS)
            for p in PROMPTS])
        return [r.choices[0].message.content for r in rs], [r.usage.completion_tokens for r in rs]

    texts, counts = run(gathered, base_url)
    assert counts == [MAX_TOKENS] * len(PROMPTS)
    assert texts == alone
    assert len(set(texts)) > 1, "different prompts gave one answer: the requests were mixed up"


def test_async_stream_joins_to_the_whole_answer(client, base_url):
    whole = client.chat.completions.create(model=QWEN, messages=messages(PROMPTS[1]),
                                           max_tokens=MAX_TOKENS, temperature=0)

    async def streamed(c):
        stream = await c.chat.completions.create(
            model=QWEN, messages=messages(PROMPTS[1]), max_tokens=MAX_TOKENS, temperature=0,
            stream=True, stream_options={"include_usage": True})
        return [chunk async for chunk in stream]

    chunks = run(streamed, base_url)
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    reasons = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert content == whole.choices[0].message.content
    assert reasons == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    usage = chunks[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        whole.usage.prompt_tokens, whole.usage.completion_tokens)


def test_async_streaming_helpers(client, base_url):
    whole = client.chat.completions.create(model=QWEN, messages=messages(PROMPTS[2]),
                                           max_tokens=MAX_TOKENS, temperature=0)
    whole_response = client.responses.create(model=QWEN, input=PROMPTS[3], max_output_tokens=MAX_TOKENS,
                                             temperature=0)

    async def helpers(c):
        deltas, done = [], []
        async with c.chat.completions.stream(model=QWEN, messages=messages(PROMPTS[2]),
                                             max_tokens=MAX_TOKENS, temperature=0,
                                             stream_options={"include_usage": True}) as s:
            async for event in s:
                if event.type == "content.delta":
                    deltas.append(event.delta)
                elif event.type == "content.done":
                    done.append(event.content)
            # tiny-qwen2 runs to max_tokens: the helper refuses to parse a cut
            # answer and says so with the completion it got.
            with pytest.raises(openai.LengthFinishReasonError) as cut:
                await s.get_final_completion()
        final = cut.value.completion
        text_deltas, ends = [], []
        async with c.responses.stream(model=QWEN, input=PROMPTS[3], max_output_tokens=MAX_TOKENS,
                                      temperature=0) as rs:
            async for event in rs:
                if event.type == "response.output_text.delta":
                    text_deltas.append(event.delta)
                elif event.type in ("response.completed", "response.incomplete"):
                    ends.append(event)
        # Cut at max_output_tokens, the stream ends on `response.incomplete`
        # (as OpenAI's does), which the helper's get_final_response does not
        # take: the final response is that event's.
        [end] = ends
        response = end.response
        awaited = await c.responses.create(model=QWEN, input=PROMPTS[3], max_output_tokens=MAX_TOKENS,
                                           temperature=0)
        return deltas, done, final, text_deltas, response, awaited

    deltas, done, final, text_deltas, response, awaited = run(helpers, base_url)
    assert whole.choices[0].finish_reason == "length"
    assert "".join(deltas) == whole.choices[0].message.content
    assert done == [whole.choices[0].message.content]
    assert final.choices[0].message.content == whole.choices[0].message.content
    assert final.usage.completion_tokens == whole.usage.completion_tokens
    assert whole_response.output_text
    assert "".join(text_deltas) == whole_response.output_text
    assert (whole_response.status, response.status) == ("incomplete", "incomplete")
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == whole_response.output_text
    assert awaited.output_text == whole_response.output_text


def test_typed_errors_from_awaits(base_url):
    async def errors(c):
        raised = []
        for call in (
            lambda: c.chat.completions.create(model="no-such-model", messages=messages("hi")),
            lambda: c.chat.completions.create(model=QWEN, messages=messages("hi"), temperature=5),
            lambda: c.responses.retrieve("resp_does_not_exist"),
        ):
            try:
                await call()
            except openai.APIStatusError as e:
                raised.append(e)
        return raised

    not_found, bad, missing = run(errors, base_url)
    assert isinstance(not_found, openai.NotFoundError) and not_found.status_code == 404
    assert "no-such-model" in not_found.message
    assert isinstance(bad, openai.BadRequestError) and bad.status_code == 400
    assert bad.body and bad.body.get("param") == "temperature", bad.body
    assert isinstance(missing, openai.NotFoundError)


def test_closing_a_stream_early_frees_the_request(qwen, base_url):
    before = stats(qwen)
    limit = 2000

    async def leave_early(c):
        stream = await c.chat.completions.create(
            model=QWEN, messages=messages("Go on forever."), max_tokens=limit, temperature=0,
            logit_bias=NO_EOS, stream=True)
        n = 0
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                n += 1
                if n >= 5:
                    break
        await stream.close()
        return n

    read = run(leave_early, base_url)
    assert read == 5
    deadline = time.monotonic() + 60
    while True:
        s = stats(qwen)
        if int(s.get("running", 0)) == 0 and int(s.get("waiting", 0)) == 0:
            break
        assert time.monotonic() < deadline, f"the request still runs after its stream was closed: {s}"
        time.sleep(0.1)
    made = int(s.get("generatedTokensTotal", 0)) - int(before.get("generatedTokensTotal", 0))
    assert read <= made < limit // 2, f"{made} tokens generated for a stream closed after {read}"
    assert int(s.get("kvBlocksUsed", 0)) == 0, s
