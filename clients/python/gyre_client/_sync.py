"""The blocking client."""
from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import grpc

from gyre.v1 import generate_pb2 as pb
from gyre.v1 import generate_pb2_grpc as pb_grpc

from . import _wire_pb2 as wire
from ._common import (HEALTH_CHECK, HEALTH_STATUS, Accumulator, Chunk, Completion, GyreError, Message, Prompt,
                      TlsArg, Tokens, auth_metadata, build_request, channel_config, model_from_metadata,
                      tokenize_request)


class Client:
    """A blocking client of one gyre server (`host:port`, optionally
    `http://` or `https://`).

        with Client("127.0.0.1:50051") as c:
            print(c.generate("The capital of France is", max_tokens=8, temperature=0).text)

    `api_key` is sent as `authorization: Bearer <key>` on every call; `tls`
    is None (plaintext, unless the target says https://), True (the
    system's roots), a `TLS` (CA, client certificate) or grpc credentials.
    `timeout` (seconds) is the default deadline of each call. Failed calls
    raise `GyreError`."""

    def __init__(self, target: str, api_key: str | None = None, tls: TlsArg = None, *,
                 timeout: float | None = None, options: Iterable[tuple[str, Any]] = ()):
        address, creds, opts = channel_config(target, tls)
        opts = [*opts, *options]
        self.channel = (grpc.secure_channel(address, creds, options=opts) if creds
                        else grpc.insecure_channel(address, options=opts))
        self.stub = pb_grpc.GenerationStub(self.channel)
        self._metadata = auth_metadata(api_key)
        self._timeout = timeout
        self._health = self.channel.unary_unary(HEALTH_CHECK,
                                                request_serializer=wire.HealthCheckRequest.SerializeToString,
                                                response_deserializer=wire.HealthCheckResponse.FromString)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method, request, timeout: float | None):
        try:
            return method(request, metadata=self._metadata, timeout=timeout or self._timeout)
        except grpc.RpcError as e:
            raise GyreError.from_rpc_error(e) from None

    # -- generation ---------------------------------------------------------

    def stream(self, prompt: Prompt | None = None, *, messages: Iterable[Message] | None = None,
               timeout: float | None = None, **params: Any) -> "Stream":
        """Starts one request (`GenerateStream`) and returns its `Stream`:
        iterate it for `Chunk`s as they arrive; afterwards `.completion`
        holds the finish (reason, usage). Parameters as in `generate`."""
        req = build_request(prompt, messages=messages, **params)
        call = self.stub.GenerateStream(req, metadata=self._metadata, timeout=timeout or self._timeout)
        return Stream(call)

    def generate(self, prompt: Prompt | None = None, *, messages: Iterable[Message] | None = None,
                 timeout: float | None = None, **params: Any) -> Completion:
        """Generates from `prompt` (text, or token ids) or chat `messages`
        and returns the whole `Completion`. Keyword parameters: model,
        max_tokens, stop, the sampling fields (temperature, top_p, top_k,
        seed, min_p, presence_penalty, frequency_penalty,
        repetition_penalty, logit_bias) and any other field of
        `gyre.v1.Request` (ignore_eos, stop_token_ids, priority, ...)."""
        s = self.stream(prompt, messages=messages, timeout=timeout, **params)
        for _ in s:
            pass
        if s.completion is None:
            raise GyreError(grpc.StatusCode.UNKNOWN, "the stream ended without a finish")
        return s.completion

    def chat(self, messages: Iterable[Message], **params: Any) -> Completion:
        """`generate` on chat messages, rendered with the model's chat template."""
        return self.generate(messages=messages, **params)

    def session(self, *, timeout: float | None = None) -> "Session":
        """A bidirectional `Generate` stream carrying many requests at once."""
        return Session(self, timeout or self._timeout)

    # -- everything else ----------------------------------------------------

    def tokenize(self, text: str | None = None, *, messages: Iterable[Message] | None = None,
                 model: str | None = None, add_special_tokens: bool | None = None,
                 timeout: float | None = None) -> Tokens:
        req = tokenize_request(text, messages, model, add_special_tokens)
        return Tokens.from_pb(self._call(self.stub.Tokenize, req, timeout))

    def detokenize(self, token_ids: Iterable[int], *, model: str | None = None,
                   skip_special_tokens: bool | None = None, timeout: float | None = None) -> str:
        req = pb.DetokenizeRequest(model=model or "", token_ids=list(token_ids))
        if skip_special_tokens is not None:
            req.skip_special_tokens = skip_special_tokens
        return self._call(self.stub.Detokenize, req, timeout).text

    def models(self, *, timeout: float | None = None) -> list[pb.Model]:
        return list(self._call(self.stub.ListModels, pb.ListModelsRequest(), timeout).models)

    def stats(self, model: str | None = None, *, timeout: float | None = None) -> pb.EngineStats:
        return self._call(self.stub.GetStats, pb.GetStatsRequest(model=model or ""), timeout)

    def health(self, service: str = "", *, timeout: float | None = None) -> str:
        """grpc.health.v1: "SERVING", "NOT_SERVING", ... of the server
        (`service` empty) or of one model (its id)."""
        res = self._call(self._health, wire.HealthCheckRequest(service=service), timeout)
        return HEALTH_STATUS.get(res.status, "UNKNOWN")


class Stream:
    """The events of one `GenerateStream` call, as `Chunk`s."""

    def __init__(self, call):
        self._call = call
        self._acc = Accumulator()
        self.completion: Completion | None = None

    def __iter__(self) -> Iterator[Chunk]:
        try:
            if self._acc.model is None:
                self._acc.model = model_from_metadata(self._call.initial_metadata())
            for ev in self._call:
                kind = ev.WhichOneof("event")
                if kind == "delta":
                    yield self._acc.delta(ev.delta, ev.request_id)
                elif kind == "finish":
                    self.completion = self._acc.finish(ev.finish, ev.request_id)
        except grpc.RpcError as e:
            raise GyreError.from_rpc_error(e) from None

    def cancel(self) -> None:
        """Cancels the call, and with it the generation."""
        self._call.cancel()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        """Leaving a `with` block before the end cancels the generation."""
        if self.completion is None:
            self.cancel()


_END = object()


class Session:
    """Requests multiplexed on one `Generate` stream.

        with client.session() as s:
            a = s.submit("Once upon a time", max_tokens=32)
            b = s.submit(messages=[{"role": "user", "content": "Hi"}])
            for chunk in b:
                b.cancel()
            print(a.result().text)

    Leaving the block half-closes the stream and waits for the requests
    still running; `abort()` drops it (cancelling every request)."""

    def __init__(self, client: Client, timeout: float | None):
        self._client = client
        self._outbox: queue.Queue = queue.Queue()
        self._handles: dict[str, SessionRequest] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._error: GyreError | None = None
        self._call = client.stub.Generate(self._requests(), metadata=client._metadata, timeout=timeout)
        self._reader = threading.Thread(target=self._read, daemon=True, name="gyre-session")
        self._reader.start()

    def _requests(self):
        while (msg := self._outbox.get()) is not _END:
            yield msg

    def _read(self) -> None:
        try:
            for ev in self._call:
                with self._lock:
                    h = self._handles.get(ev.request_id)
                if h is not None:
                    h._events.put(ev)
            err = None
        except grpc.RpcError as e:
            err = GyreError.from_rpc_error(e)
        with self._lock:
            self._error = err
            handles = list(self._handles.values())
        for h in handles:
            h._events.put(_END)

    def submit(self, prompt: Prompt | None = None, *, messages: Iterable[Message] | None = None,
               request_id: str | None = None, **params: Any) -> "SessionRequest":
        """Starts a request on the stream (parameters as `Client.generate`);
        `request_id` unset: a fresh one."""
        rid = request_id or f"r{next(self._ids)}"
        req = build_request(prompt, messages=messages, request_id=rid, **params)
        h = SessionRequest(self, rid)
        with self._lock:
            if self._error is not None or not self._reader.is_alive():
                raise self._error or GyreError(grpc.StatusCode.CANCELLED, "the session is closed")
            if rid in self._handles:
                raise _duplicate(rid)
            self._handles[rid] = h
        self._outbox.put(pb.GenerateRequest(start=req))
        return h

    def cancel(self, request_id: str) -> None:
        """Cancels a running request (unknown or finished ids are ignored)."""
        self._outbox.put(pb.GenerateRequest(cancel=pb.Cancel(request_id=request_id)))

    def close(self) -> None:
        """Half-closes the stream and waits until the server has finished every request."""
        self._outbox.put(_END)
        self._reader.join()

    def abort(self) -> None:
        """Drops the stream: the server cancels every request on it."""
        self._call.cancel()
        self._outbox.put(_END)
        self._reader.join()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


class SessionRequest:
    """One request of a `Session`: iterate it for its `Chunk`s, or call
    `result()` for the `Completion` (which raises `GyreError` when it failed
    or was rejected)."""

    def __init__(self, session: Session, request_id: str):
        self.request_id = request_id
        self._session = session
        self._events: queue.Queue = queue.Queue()
        self._acc = Accumulator(request_id=request_id)
        self._done = False
        self._error: GyreError | None = None

    def cancel(self) -> None:
        self._session.cancel(self.request_id)

    def __iter__(self) -> Iterator[Chunk]:
        if self._error is not None:
            raise self._error
        while not self._done:
            ev = self._events.get()
            try:
                chunk = _on_event(self, ev)
            except GyreError as e:
                self._error = e
                raise
            if chunk is not None:
                yield chunk

    def _forget(self) -> None:
        self._done = True
        with self._session._lock:
            self._session._handles.pop(self.request_id, None)

    def result(self) -> Completion:
        for _ in self:
            pass
        if self._acc.completion is None:
            raise GyreError(grpc.StatusCode.UNKNOWN, "the request did not finish", request_id=self.request_id)
        return self._acc.completion


def _duplicate(rid: str) -> GyreError:
    """What the server would answer (`rejected`), said before sending: the
    id names a request of this session that has not finished."""
    return GyreError(grpc.StatusCode.ALREADY_EXISTS, f"request id {rid!r} is still running on this stream",
                     reason="DUPLICATE_REQUEST_ID", field="start.request_id", request_id=rid)


def _on_event(h, ev) -> Chunk | None:
    """One event of a session request (sync or async): its chunk, None, or
    GyreError when it failed, was rejected or its stream ended first."""
    if ev is _END:
        h._forget()
        raise h._session._error or GyreError(grpc.StatusCode.CANCELLED, "the stream ended before the request finished",
                                             request_id=h.request_id)
    kind = ev.WhichOneof("event")
    if kind == "delta":
        return h._acc.delta(ev.delta, ev.request_id)
    if kind == "rejected":
        h._forget()
        raise GyreError.from_request_error(ev.rejected.error, h.request_id)
    if kind == "finish":
        h._forget()
        h._acc.finish(ev.finish, ev.request_id)
    return None
