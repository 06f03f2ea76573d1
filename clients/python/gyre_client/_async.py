"""The asyncio client (grpc.aio): `AsyncClient` mirrors `Client`."""
from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterable
from typing import Any

import grpc
import grpc.aio

from gyre.v1 import generate_pb2 as pb
from gyre.v1 import generate_pb2_grpc as pb_grpc

from . import _wire_pb2 as wire
from ._common import (HEALTH_CHECK, HEALTH_STATUS, Accumulator, Chunk, Completion, GyreError, Message, Prompt,
                      TlsArg, Tokens, auth_metadata, build_request, channel_config, model_from_metadata,
                      tokenize_request)
from ._sync import _END, _duplicate, _on_event


class AsyncClient:
    """The asyncio form of `Client` (same arguments; create it inside the
    event loop that uses it).

        async with AsyncClient("127.0.0.1:50051") as c:
            async for chunk in c.stream("Once upon a time", max_tokens=16):
                print(chunk.text, end="")"""

    def __init__(self, target: str, api_key: str | None = None, tls: TlsArg = None, *,
                 timeout: float | None = None, options: Iterable[tuple[str, Any]] = ()):
        address, creds, opts = channel_config(target, tls)
        opts = [*opts, *options]
        self.channel = (grpc.aio.secure_channel(address, creds, options=opts) if creds
                        else grpc.aio.insecure_channel(address, options=opts))
        self.stub = pb_grpc.GenerationStub(self.channel)
        self._metadata = auth_metadata(api_key)
        self._timeout = timeout
        self._health = self.channel.unary_unary(HEALTH_CHECK,
                                                request_serializer=wire.HealthCheckRequest.SerializeToString,
                                                response_deserializer=wire.HealthCheckResponse.FromString)

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _call(self, method, request, timeout: float | None):
        try:
            return await method(request, metadata=self._metadata, timeout=timeout or self._timeout)
        except grpc.RpcError as e:
            raise GyreError.from_rpc_error(e) from None

    def stream(self, prompt: Prompt | None = None, *, messages: Iterable[Message] | None = None,
               timeout: float | None = None, **params: Any) -> "AsyncStream":
        """`async for chunk in client.stream(...)`; then `.completion`."""
        req = build_request(prompt, messages=messages, **params)
        return AsyncStream(self.stub.GenerateStream(req, metadata=self._metadata, timeout=timeout or self._timeout))

    async def generate(self, prompt: Prompt | None = None, *, messages: Iterable[Message] | None = None,
                       timeout: float | None = None, **params: Any) -> Completion:
        s = self.stream(prompt, messages=messages, timeout=timeout, **params)
        async for _ in s:
            pass
        if s.completion is None:
            raise GyreError(grpc.StatusCode.UNKNOWN, "the stream ended without a finish")
        return s.completion

    async def chat(self, messages: Iterable[Message], **params: Any) -> Completion:
        return await self.generate(messages=messages, **params)

    def session(self, *, timeout: float | None = None) -> "AsyncSession":
        """`async with client.session() as s:` (see `Session`)."""
        return AsyncSession(self, timeout or self._timeout)

    async def tokenize(self, text: str | None = None, *, messages: Iterable[Message] | None = None,
                       model: str | None = None, add_special_tokens: bool | None = None,
                       timeout: float | None = None) -> Tokens:
        req = tokenize_request(text, messages, model, add_special_tokens)
        return Tokens.from_pb(await self._call(self.stub.Tokenize, req, timeout))

    async def detokenize(self, token_ids: Iterable[int], *, model: str | None = None,
                         skip_special_tokens: bool | None = None, timeout: float | None = None) -> str:
        req = pb.DetokenizeRequest(model=model or "", token_ids=list(token_ids))
        if skip_special_tokens is not None:
            req.skip_special_tokens = skip_special_tokens
        return (await self._call(self.stub.Detokenize, req, timeout)).text

    async def models(self, *, timeout: float | None = None) -> list[pb.Model]:
        return list((await self._call(self.stub.ListModels, pb.ListModelsRequest(), timeout)).models)

    async def stats(self, model: str | None = None, *, timeout: float | None = None) -> pb.EngineStats:
        return await self._call(self.stub.GetStats, pb.GetStatsRequest(model=model or ""), timeout)

    async def health(self, service: str = "", *, timeout: float | None = None) -> str:
        res = await self._call(self._health, wire.HealthCheckRequest(service=service), timeout)
        return HEALTH_STATUS.get(res.status, "UNKNOWN")


class AsyncStream:
    """The events of one `GenerateStream` call, as `Chunk`s (async)."""

    def __init__(self, call):
        self._call = call
        self._acc = Accumulator()
        self.completion: Completion | None = None

    async def __aiter__(self) -> AsyncIterator[Chunk]:
        try:
            if self._acc.model is None:
                self._acc.model = model_from_metadata(await self._call.initial_metadata())
            async for ev in self._call:
                kind = ev.WhichOneof("event")
                if kind == "delta":
                    yield self._acc.delta(ev.delta, ev.request_id)
                elif kind == "finish":
                    self.completion = self._acc.finish(ev.finish, ev.request_id)
        except grpc.RpcError as e:
            raise GyreError.from_rpc_error(e) from None

    def cancel(self) -> None:
        self._call.cancel()

    async def __aenter__(self) -> "AsyncStream":
        return self

    async def __aexit__(self, *exc) -> None:
        if self.completion is None:
            self.cancel()


class AsyncSession:
    """Requests multiplexed on one `Generate` stream (async)."""

    def __init__(self, client: AsyncClient, timeout: float | None):
        self._client = client
        self._timeout = timeout
        self._handles: dict[str, AsyncSessionRequest] = {}
        self._ids = itertools.count(1)
        self._error: GyreError | None = None
        self._call = None
        self._reader: asyncio.Task | None = None

    async def __aenter__(self) -> "AsyncSession":
        self._call = self._client.stub.Generate(metadata=self._client._metadata, timeout=self._timeout)
        self._reader = asyncio.get_running_loop().create_task(self._read())
        return self

    async def __aexit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            await self.close()
        else:
            await self.abort()

    async def _read(self) -> None:
        err = None
        try:
            while (ev := await self._call.read()) is not grpc.aio.EOF:
                h = self._handles.get(ev.request_id)
                if h is not None:
                    h._events.put_nowait(ev)
        except grpc.RpcError as e:
            err = GyreError.from_rpc_error(e)
        except asyncio.CancelledError:
            err = GyreError(grpc.StatusCode.CANCELLED, "the session was aborted")
        self._error = err
        for h in list(self._handles.values()):
            h._events.put_nowait(_END)

    async def submit(self, prompt: Prompt | None = None, *, messages: Iterable[Message] | None = None,
                     request_id: str | None = None, **params: Any) -> "AsyncSessionRequest":
        if self._call is None:
            raise RuntimeError("use the session as `async with client.session() as s`")
        rid = request_id or f"r{next(self._ids)}"
        req = build_request(prompt, messages=messages, request_id=rid, **params)
        if self._error is not None or self._reader.done():
            raise self._error or GyreError(grpc.StatusCode.CANCELLED, "the session is closed")
        if rid in self._handles:
            raise _duplicate(rid)
        h = AsyncSessionRequest(self, rid)
        self._handles[rid] = h
        try:
            await self._call.write(pb.GenerateRequest(start=req))
        except grpc.RpcError as e:
            raise GyreError.from_rpc_error(e) from None
        return h

    async def cancel(self, request_id: str) -> None:
        try:
            await self._call.write(pb.GenerateRequest(cancel=pb.Cancel(request_id=request_id)))
        except grpc.RpcError as e:
            raise GyreError.from_rpc_error(e) from None

    async def close(self) -> None:
        """Half-closes the stream and waits until the server has finished every request."""
        try:
            await self._call.done_writing()
        except grpc.RpcError:
            pass
        await self._reader

    async def abort(self) -> None:
        self._call.cancel()
        await self._reader


class AsyncSessionRequest:
    """One request of an `AsyncSession`: `async for chunk in it`, or
    `await it.result()`."""

    def __init__(self, session: AsyncSession, request_id: str):
        self.request_id = request_id
        self._session = session
        self._events: asyncio.Queue = asyncio.Queue()
        self._acc = Accumulator(request_id=request_id)
        self._done = False
        self._error: GyreError | None = None

    def _forget(self) -> None:
        self._done = True
        self._session._handles.pop(self.request_id, None)

    async def cancel(self) -> None:
        await self._session.cancel(self.request_id)

    async def __aiter__(self) -> AsyncIterator[Chunk]:
        if self._error is not None:
            raise self._error
        while not self._done:
            ev = await self._events.get()
            try:
                chunk = _on_event(self, ev)
            except GyreError as e:
                self._error = e
                raise
            if chunk is not None:
                yield chunk

    async def result(self) -> Completion:
        async for _ in self:
            pass
        if self._acc.completion is None:
            raise GyreError(grpc.StatusCode.UNKNOWN, "the request did not finish", request_id=self.request_id)
        return self._acc.completion
