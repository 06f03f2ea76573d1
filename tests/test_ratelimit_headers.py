"""The six `x-ratelimit-*` headers on every answer of a tenant's call, on
both protocols (`--keys-file`).

Each route a quota admits (chat and completions, streamed and not,
embeddings, Responses create streamed and not; gRPC `GenerateStream`, the
bidi `Generate`, `Responses.Create`, `Embeddings.Embed`) is called twice
with a fresh tenant's key: both answers carry all six headers (gRPC
response metadata of the same names), and the second reports one request
fewer remaining. Routes no quota counts (tokenize, the model list, the
stored-response and conversation routes; gRPC `Tokenize`, `ListModels`,
`Responses.Get`) carry the figures as they stand, unchanged by the call.
On the bidi `Generate` the headers are the call's response head, sent as
the call opens: they show the tenant's figures before any request on it.
A refused request (400 / INVALID_ARGUMENT) carries them too, uncounted.
"""

from __future__ import annotations

import sys

import grpc
import openai
import pytest

import harness
from conftest import QWEN
from test_tenants import keys_file

sys.path.insert(0, str(harness.REPO / "clients" / "python"))
from gyre.v1 import embeddings_pb2 as epb  # noqa: E402
from gyre.v1 import embeddings_pb2_grpc as epb_grpc  # noqa: E402
from gyre.v1 import generate_pb2 as pb  # noqa: E402
from gyre.v1 import generate_pb2_grpc as pb_grpc  # noqa: E402
from gyre.v1 import responses_pb2 as rpb  # noqa: E402
from gyre.v1 import responses_pb2_grpc as rpb_grpc  # noqa: E402

EMBED = "all-minilm-l6-v2"
RPM, TPM = 50, 100_000
NAMES = ("x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests",
         "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens")

HTTP_COUNTED = ("chat", "chat_stream", "completions", "completions_stream", "embeddings",
                "responses", "responses_stream", "openai_sdk_chat")
GRPC_COUNTED = ("generate_stream", "generate_bidi", "responses_create", "embed")
UNCOUNTED = ("http_uncounted", "grpc_uncounted", "refused")
TENANTS = {name: {"requests_per_minute": RPM, "tokens_per_minute": TPM}
           for name in (*HTTP_COUNTED, *GRPC_COUNTED, *UNCOUNTED)}


def key(tenant: str) -> str:
    return f"key-{tenant}"


@pytest.fixture(scope="module")
def server(tmp_path_factory, module_server) -> harness.Server:
    path = tmp_path_factory.mktemp("keys") / "keys.toml"
    path.write_text(keys_file(TENANTS, {key(t): t for t in TENANTS}))
    return module_server(QWEN, "--model", str(harness.model_dir(EMBED)), "--keys-file", str(path))


def figures(headers) -> dict[str, str]:
    """The six headers (all must be there), from HTTP headers or gRPC metadata."""
    got = {k.lower(): v for k, v in dict(headers).items()}
    missing = [n for n in NAMES if n not in got]
    assert not missing, (missing, got)
    assert got["x-ratelimit-limit-requests"] == str(RPM)
    assert got["x-ratelimit-limit-tokens"] == str(TPM)
    return {n: got[n] for n in NAMES}


def remaining(headers) -> int:
    return int(figures(headers)["x-ratelimit-remaining-requests"])


def auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key(tenant)}"}


def metadata(tenant: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {key(tenant)}")]


# --- HTTP ------------------------------------------------------------------


def http_call(server: harness.Server, route: str) -> dict[str, str]:
    """One call of `route` with its own tenant's key; the answer's headers."""
    headers = auth(route)
    chat = {"model": QWEN, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    completion = {"model": QWEN, "prompt": "Once upon", "max_tokens": 3}
    if route == "openai_sdk_chat":
        client = openai.OpenAI(base_url=f"http://{server.http}/v1", api_key=key(route), max_retries=0)
        raw = client.chat.completions.with_raw_response.create(**chat)
        assert raw.parse().choices[0].message.content is not None
        return dict(raw.headers)
    if route.endswith("_stream"):
        path, body = {"chat_stream": ("/v1/chat/completions", chat),
                      "completions_stream": ("/v1/completions", completion),
                      "responses_stream": ("/v1/responses", {"model": QWEN, "input": "Hi", "max_output_tokens": 3}),
                      }[route]
        reply = harness.http_sse(server.http, path, {**body, "stream": True}, headers=headers)
        assert reply.status == 200, reply.body
        assert reply.events, reply.body
        return reply.headers
    path, body = {"chat": ("/v1/chat/completions", chat),
                  "completions": ("/v1/completions", completion),
                  "embeddings": ("/v1/embeddings", {"model": EMBED, "input": ["a cat", "a dog"]}),
                  "responses": ("/v1/responses", {"model": QWEN, "input": "Hi", "max_output_tokens": 3}),
                  }[route]
    reply = harness.http_json(server.http, path, body, headers=headers)
    assert reply.status == 200, reply.body
    return reply.headers


@pytest.mark.parametrize("route", HTTP_COUNTED)
def test_every_counted_http_route_answers_the_headers_and_counts_the_request(server, route):
    first = remaining(http_call(server, route))
    second = remaining(http_call(server, route))
    assert first == RPM - 1
    assert second == first - 1


def test_http_routes_no_quota_counts_answer_the_figures_unchanged(server):
    tenant = "http_uncounted"
    headers = auth(tenant)
    created = harness.http_json(server.http, "/v1/responses",
                                {"model": QWEN, "input": "Hi", "max_output_tokens": 3}, headers=headers)
    assert created.status == 200, created.body
    after = remaining(created.headers)
    assert after == RPM - 1
    rid = created.json()["id"]
    conversation = harness.http_json(server.http, "/v1/conversations", {}, headers=headers)
    assert conversation.status == 200, conversation.body
    cid = conversation.json()["id"]
    calls = [("POST", "/tokenize", {"model": QWEN, "prompt": "Hello"}),
             ("GET", "/v1/models", None),
             ("GET", f"/v1/models/{QWEN}", None),
             ("GET", f"/v1/responses/{rid}", None),
             ("GET", f"/v1/responses/{rid}/input_items", None),
             ("POST", "/v1/responses/input_tokens", {"model": QWEN, "input": "Hi"}),
             ("GET", f"/v1/conversations/{cid}", None),
             ("GET", f"/v1/conversations/{cid}/items", None),
             ("DELETE", f"/v1/conversations/{cid}", None),
             ("DELETE", f"/v1/responses/{rid}", None)]
    assert remaining(conversation.headers) == after
    for method, path, body in calls:
        reply = harness.http_json(server.http, path, body, method=method, headers=headers)
        assert reply.status == 200, (path, reply.body)
        assert remaining(reply.headers) == after, path


# --- gRPC ------------------------------------------------------------------


def generate_stream(channel, tenant: str):
    call = pb_grpc.GenerationStub(channel).GenerateStream(
        pb.Request(model=QWEN, text="Once upon", max_tokens=3), metadata=metadata(tenant))
    events = list(call)
    assert events[-1].HasField("finish"), events[-1]
    return call.initial_metadata()


def generate_bidi(channel, tenant: str):
    """One request on a fresh `Generate` call, run to its finish."""
    start = pb.GenerateRequest(start=pb.Request(request_id="r1", model=QWEN, text="Once upon", max_tokens=3))
    call = pb_grpc.GenerationStub(channel).Generate(iter([start]), metadata=metadata(tenant))
    events = list(call)
    assert events and events[-1].HasField("finish"), events
    assert events[-1].finish.reason != pb.FINISH_REASON_ERROR, events[-1]
    return call.initial_metadata()


def responses_create(channel, tenant: str):
    call = rpb_grpc.ResponsesStub(channel).Create(
        rpb.CreateResponseRequest(model=QWEN, text="Hi", max_output_tokens=3), metadata=metadata(tenant))
    events = list(call)
    assert events[-1].WhichOneof("event") in ("completed", "incomplete"), events[-1]
    return call.initial_metadata()


def embed(channel, tenant: str):
    answer, call = epb_grpc.EmbeddingsStub(channel).Embed.with_call(
        epb.EmbedRequest(model=EMBED, texts=epb.Texts(texts=["a cat"])), metadata=metadata(tenant))
    assert len(answer.embeddings) == 1
    return call.initial_metadata()


GRPC_CALLS = {"generate_stream": generate_stream, "generate_bidi": generate_bidi,
              "responses_create": responses_create, "embed": embed}


@pytest.mark.parametrize("route", GRPC_COUNTED)
def test_every_counted_grpc_route_answers_the_metadata_and_counts_the_request(server, route):
    with grpc.insecure_channel(server.grpc) as channel:
        first = remaining(GRPC_CALLS[route](channel, route))
        second = remaining(GRPC_CALLS[route](channel, route))
    if route == "generate_bidi":
        # The call's head goes out before its request is admitted.
        assert first == RPM
    else:
        assert first == RPM - 1
    assert second == first - 1


def test_grpc_routes_no_quota_counts_answer_the_figures_unchanged(server):
    tenant = "grpc_uncounted"
    with grpc.insecure_channel(server.grpc) as channel:
        after = remaining(generate_stream(channel, tenant))
        assert after == RPM - 1
        generation = pb_grpc.GenerationStub(channel)
        _, call = generation.Tokenize.with_call(pb.TokenizeRequest(model=QWEN, text="Hello"),
                                                metadata=metadata(tenant))
        assert remaining(call.initial_metadata()) == after
        _, call = generation.ListModels.with_call(pb.ListModelsRequest(), metadata=metadata(tenant))
        assert remaining(call.initial_metadata()) == after
        responses = rpb_grpc.ResponsesStub(channel)
        events = list(responses.Create(rpb.CreateResponseRequest(model=QWEN, text="Hi", max_output_tokens=3),
                                       metadata=metadata(tenant)))
        last = events[-1]
        rid = getattr(last, last.WhichOneof("event")).id
        got, call = responses.Get.with_call(rpb.GetResponseRequest(response_id=rid), metadata=metadata(tenant))
        assert got.id == rid
        assert remaining(call.initial_metadata()) == after - 1


def test_a_refused_request_carries_the_figures_on_both_protocols(server):
    tenant = "refused"
    bad = {"model": QWEN, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": -1}
    reply = harness.http_json(server.http, "/v1/chat/completions", bad, headers=auth(tenant))
    assert reply.status == 400, reply.body
    assert reply.json()["error"]["param"] == "temperature"
    assert remaining(reply.headers) == RPM
    with grpc.insecure_channel(server.grpc) as channel:
        call = pb_grpc.GenerationStub(channel).GenerateStream(
            pb.Request(model=QWEN, text="Hi", max_tokens=3, sampling=pb.SamplingParams(temperature=-1)),
            metadata=metadata(tenant))
        with pytest.raises(grpc.RpcError) as refused:
            list(call)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        meta = {**dict(refused.value.initial_metadata() or ()), **dict(refused.value.trailing_metadata() or ())}
        assert remaining(meta) == RPM
