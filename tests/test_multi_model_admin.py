"""gyre.v1.Admin: loading and unloading models while `gyre serve` runs, and
the admin key's scope.

The server starts with tiny-llama as `chat`, an API key and an admin key; the
tests load tiny-qwen2 under a name and alias, chat with it through the OpenAI
SDK, and unload it while a streamed request is running: that request
finishes, new requests get 404 at once, and `/v1/models`, `ListModels` and
health follow.
"""

from __future__ import annotations

import threading
import time

import grpc
import openai
import pytest

import harness
from conftest import assert_no_panic

API_KEY = "user-key"
ADMIN_KEY = "admin-key"
ADMIN = [f"authorization: Bearer {ADMIN_KEY}"]
USER = [f"authorization: Bearer {API_KEY}"]


@pytest.fixture(scope="module")
def server():
    llama = harness.model_dir("tiny-llama")
    s = harness.Server.start([str(harness.GYRE_BIN), "serve", "--http-addr", "127.0.0.1:0",
                              "--grpc-addr", "127.0.0.1:0", "--kv-cache-mib", "16",
                              "--device-memory-mib", "100", "--model", f"{llama},name=chat",
                              "--api-key", API_KEY, "--admin-api-key", ADMIN_KEY])
    yield s
    s.stop()
    assert_no_panic(s)
    s.remove_log()


@pytest.fixture(scope="module")
def sdk(server):
    return openai.OpenAI(base_url=f"http://{server.http}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def admin(server, method: str, body: dict, headers=ADMIN) -> harness.BufResult:
    return harness.buf_curl(server.grpc, f"gyre.v1.Admin/{method}", body, headers=headers)


def listed(sdk) -> list[str]:
    return [m.id for m in sdk.models.list().data]


def health(server, name: str) -> str:
    r = harness.buf_curl(server.grpc, "grpc.health.v1.Health/Check", {"service": name})
    return r.messages[0]["status"] if r.rc == 0 else r.error["code"]


def test_the_admin_key_and_the_api_key_grant_only_their_own_service(server):
    assert admin(server, "ListModels", {}, headers=[]).error["code"] == "unauthenticated"
    assert admin(server, "ListModels", {}, headers=["authorization: Bearer wrong"]).error["code"] == "unauthenticated"
    denied = admin(server, "ListModels", {}, headers=USER)
    assert denied.error["code"] == "permission_denied", denied.stderr
    ok = admin(server, "ListModels", {}).ok().messages[0]["models"]
    assert [m["model"]["id"] for m in ok] == ["chat"]
    assert int(ok[0]["kvCacheBytes"]) == 16 << 20 and ok[0]["source"].endswith("tiny-llama")
    # The admin key opens neither the generation service nor the HTTP API.
    gen = harness.buf_curl(server.grpc, "gyre.v1.Generation/ListModels", {}, headers=ADMIN)
    assert gen.error["code"] == "unauthenticated"
    assert harness.buf_curl(server.grpc, "gyre.v1.Generation/ListModels", {}, headers=USER).rc == 0
    http = harness.http_json(server.http, "/v1/models", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert http.status == 401 and http.json()["error"]["code"] == "invalid_api_key"


def test_load_errors_are_clear(server):
    qwen = str(harness.model_dir("tiny-qwen2"))
    missing = admin(server, "LoadModel", {"source": "/nonexistent/model-dir"})
    assert missing.error["code"] == "invalid_argument" and "no such file" in missing.error["message"]
    taken = admin(server, "LoadModel", {"source": qwen, "name": "chat"})
    assert taken.error["code"] == "already_exists" and "`chat`" in taken.error["message"]
    alias_taken = admin(server, "LoadModel", {"source": qwen, "name": "other", "aliases": ["chat"]})
    assert alias_taken.error["code"] == "already_exists"
    bad_date = admin(server, "LoadModel", {"source": qwen, "name": "x", "deprecated": "soon"})
    assert bad_date.error["code"] == "invalid_argument" and "not a date" in bad_date.error["message"]
    # 100 MiB of device memory, 32 MiB of them promised to `chat`: tiny-qwen2
    # (37 MiB of weights) with a 64 MiB KV cache cannot fit.
    huge = admin(server, "LoadModel", {"source": qwen, "name": "huge", "kv_cache_mib": 64})
    assert huge.error["code"] == "resource_exhausted", huge.stderr
    assert "model `huge` does not fit" in huge.error["message"] and "short by" in huge.error["message"]
    unknown = admin(server, "UnloadModel", {"name": "nope"})
    assert unknown.error["code"] == "not_found"
    # Nothing of these was served.
    assert [m["model"]["id"] for m in admin(server, "ListModels", {}).ok().messages[0]["models"]] == ["chat"]


class Watch:
    """A grpc.health.v1 Watch of one service, its updates collected (the
    status enum's value: 1 SERVING, 2 NOT_SERVING, 3 SERVICE_UNKNOWN)."""

    def __init__(self, server, service: str):
        self.channel = grpc.insecure_channel(server.grpc)
        request = b"\x0a" + bytes([len(service)]) + service.encode()
        self.call = self.channel.unary_stream("/grpc.health.v1.Health/Watch", request_serializer=lambda b: b,
                                              response_deserializer=lambda b: b)(request)
        self.seen: list[int] = []
        self.error = None
        self.thread = threading.Thread(target=self._collect, daemon=True)
        self.thread.start()

    def _collect(self):
        try:
            for msg in self.call:
                self.seen.append(msg[1] if len(msg) == 2 else 0)
        except grpc.RpcError as e:
            self.error = e

    def until(self, want: list[int], what: str):
        deadline = time.monotonic() + 15
        while self.seen != want:
            assert self.error is None, f"{what}: the Watch ended: {self.error}"
            assert time.monotonic() < deadline, f"{what}: saw {self.seen}, wanted {want}"
            time.sleep(0.02)

    def close(self):
        self.call.cancel()
        self.channel.close()


def test_load_chat_and_unload_with_a_request_in_flight(server, sdk):
    qwen = str(harness.model_dir("tiny-qwen2"))
    assert health(server, "extra") == "not_found"
    # The health protocol's Watch: an unknown service is SERVICE_UNKNOWN on
    # a call that stays open, and follows the model as it comes and goes
    # (tonic-health's refused it with NOT_FOUND and ended at the unload).
    watch = Watch(server, "extra")
    watch.until([3], "before the load")
    loaded = admin(server, "LoadModel", {"source": qwen, "name": "extra", "aliases": ["extra-alias"],
                                         "version": "7", "deprecated": "2026-01-01", "kv_cache_mib": 16}).ok()
    model = loaded.messages[0]["model"]
    assert (model["id"], model["aliases"], model["version"]) == ("extra", ["extra-alias"], "7")
    # The catalogue, ListModels and health follow at once.
    assert listed(sdk) == ["chat", "extra"]
    grpc = harness.buf_curl(server.grpc, "gyre.v1.Generation/ListModels", {}, headers=USER).ok()
    assert [m["id"] for m in grpc.messages[0]["models"]] == ["chat", "extra"]
    assert health(server, "extra") == "SERVING" and health(server, "extra-alias") == "SERVING"
    watch.until([3, 1], "after the load")
    # Chat through the SDK by alias; the new model is deprecated, so the header is there.
    r = sdk.chat.completions.with_raw_response.create(
        model="extra-alias", messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0)
    assert r.headers.get("deprecation") is not None
    assert r.parse().model == "extra"

    # A long streamed request is running when the model is unloaded.
    stream = sdk.completions.create(model="extra", prompt="Once upon a time", max_tokens=1000,
                                    temperature=0, stream=True, stream_options={"include_usage": True},
                                    extra_body={"ignore_eos": True})
    chunks = iter(stream)
    first = next(chunks)
    # It is running in the engine now (1000 tokens take seconds).
    stats = {m["model"]["id"]: m for m in admin(server, "ListModels", {}).ok().messages[0]["models"]}
    assert stats["extra"].get("running", 0) + stats["extra"].get("waiting", 0) == 1, stats["extra"]
    unloaded: dict = {}
    unloader = threading.Thread(target=lambda: unloaded.update(
        result=admin(server, "UnloadModel", {"name": "extra-alias"})))
    unloader.start()
    # Wait (bounded) for the unload to take effect: the catalogue drops it.
    deadline = time.monotonic() + 15
    while "extra" in listed(sdk):
        assert time.monotonic() < deadline, "the unloaded model is still listed"
    # New requests for it get 404 at once (by name and by alias), never a hang.
    for name in ("extra", "extra-alias"):
        with pytest.raises(openai.NotFoundError) as exc:
            sdk.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert exc.value.code == "model_not_found"
    assert health(server, "extra") == "not_found" and health(server, "extra-alias") == "not_found"
    watch.until([3, 1, 3], "after the unload")
    # The running request finishes: every token, finish_reason length.
    rest = [first, *chunks]
    finishes = [c.choices[0].finish_reason for c in rest if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert rest[-1].usage is not None and rest[-1].usage.completion_tokens == 1000
    unloader.join(timeout=60)
    result = unloaded["result"].ok().messages[0]
    assert result == {"id": "extra", "drained": True}
    # The model that stayed still serves.
    assert listed(sdk) == ["chat"]
    assert sdk.completions.create(model="chat", prompt="a", max_tokens=2).model == "chat"
    # And the name is free again: it loads once more.
    again = admin(server, "LoadModel", {"source": qwen, "name": "extra", "kv_cache_mib": 16}).ok()
    assert again.messages[0]["model"]["id"] == "extra"
    watch.until([3, 1, 3, 1], "after the second load")
    watch.close()
    assert admin(server, "UnloadModel", {"name": "extra"}).ok().messages[0]["drained"] is True
