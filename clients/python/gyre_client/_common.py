"""What the sync and asyncio clients share: connection settings, request
building, results and errors."""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

import grpc
from google.protobuf import struct_pb2

from gyre.v1 import generate_pb2 as pb

from . import _wire_pb2 as wire

# ---------------------------------------------------------------------------
# Connection


@dataclass(frozen=True)
class TLS:
    """TLS settings of a channel. Each of `ca`, `cert`, `key` is PEM bytes or
    a path to a PEM file. `ca` unset: the system's roots. `cert` and `key`
    (both or neither): the client certificate a server with mTLS asks for.
    `server_name`: the name to check the server's certificate against, when
    it is not the host in the target."""

    ca: bytes | str | os.PathLike | None = None
    cert: bytes | str | os.PathLike | None = None
    key: bytes | str | os.PathLike | None = None
    server_name: str | None = None


def _pem(value) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    with open(value, "rb") as f:
        return f.read()


TlsArg = Union[None, bool, TLS, grpc.ChannelCredentials]


def channel_config(target: str, tls: TlsArg) -> tuple[str, grpc.ChannelCredentials | None, list]:
    """(host:port, credentials or None for plaintext, channel options).

    `target` may carry a scheme: `http://` is plaintext, `https://` TLS (with
    the system roots unless `tls` says otherwise)."""
    if target.startswith("https://"):
        target, tls = target[len("https://"):], (True if tls is None else tls)
    elif target.startswith("http://"):
        target = target[len("http://"):]
    target = target.rstrip("/")
    if tls is None or tls is False:
        return target, None, []
    if tls is True:
        tls = TLS()
    if isinstance(tls, grpc.ChannelCredentials):
        return target, tls, []
    if (tls.cert is None) != (tls.key is None):
        raise ValueError("TLS: give both `cert` and `key` (a client certificate) or neither")
    creds = grpc.ssl_channel_credentials(root_certificates=_pem(tls.ca), private_key=_pem(tls.key),
                                         certificate_chain=_pem(tls.cert))
    options = [("grpc.ssl_target_name_override", tls.server_name)] if tls.server_name else []
    return target, creds, options


def auth_metadata(api_key: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {api_key}"),) if api_key else ()


# ---------------------------------------------------------------------------
# Errors


_CODES = {c.value[0]: c for c in grpc.StatusCode}


class GyreError(Exception):
    """A failed call, or one failed request of a `Generate` session.

    `code` is the gRPC status (`grpc.StatusCode.NOT_FOUND`, ...); `reason`,
    `domain` and `metadata` come from the google.rpc.ErrorInfo detail when
    the server sent one; `field` names the request field at fault when the
    server said (google.rpc.BadRequest, or `RequestError.field`)."""

    def __init__(self, code: grpc.StatusCode, message: str, *, reason: str | None = None,
                 domain: str | None = None, metadata: Mapping[str, str] | None = None,
                 field: str | None = None, request_id: str | None = None):
        super().__init__(f"{code.name}: {message}" + (f" ({reason})" if reason else ""))
        self.code = code
        self.message = message
        self.reason = reason
        self.domain = domain
        self.metadata = dict(metadata or {})
        self.field = field
        self.request_id = request_id

    @classmethod
    def from_rpc_error(cls, err: grpc.RpcError) -> "GyreError":
        """From a grpc (sync or aio) error; reads `grpc-status-details-bin`."""
        code = err.code() if callable(getattr(err, "code", None)) else grpc.StatusCode.UNKNOWN
        message = err.details() if callable(getattr(err, "details", None)) else str(err)
        reason = domain = fld = None
        meta: dict[str, str] = {}
        trailing = err.trailing_metadata() if callable(getattr(err, "trailing_metadata", None)) else None
        for key, value in trailing or ():
            if key != "grpc-status-details-bin":
                continue
            status = wire.Status.FromString(value)
            for d in status.details:
                name = d.type_url.rsplit("/", 1)[-1]
                if name == "google.rpc.ErrorInfo":
                    info = wire.ErrorInfo.FromString(d.value)
                    reason, domain, meta = info.reason or None, info.domain or None, dict(info.metadata)
                elif name == "google.rpc.BadRequest":
                    violations = wire.BadRequest.FromString(d.value).field_violations
                    if violations:
                        fld = violations[0].field or None
        return cls(code or grpc.StatusCode.UNKNOWN, message or "", reason=reason, domain=domain,
                   metadata=meta, field=fld)

    @classmethod
    def from_request_error(cls, e: pb.RequestError, request_id: str | None = None) -> "GyreError":
        """From a `RequestError` of the `Generate` stream (a failed finish, a rejected start)."""
        return cls(_CODES.get(e.code, grpc.StatusCode.UNKNOWN), e.message, reason=e.reason or None,
                   field=e.field or None, request_id=request_id)


# ---------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @classmethod
    def from_pb(cls, u: pb.Usage) -> "Usage":
        return cls(u.prompt_tokens, u.completion_tokens, u.cached_tokens)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Chunk:
    """Output as it arrives: new text (and reasoning text) and the ids of
    the tokens generated since the previous chunk."""

    text: str
    token_ids: tuple[int, ...]
    reasoning: str = ""
    request_id: str = ""


@dataclass(frozen=True)
class Completion:
    """A finished request: its whole text, token ids, why it ended and its
    token counts. `finish_reason` is "stop", "length", "cancelled",
    "error" or "tool_calls"."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    usage: Usage
    request_id: str = ""
    model: str | None = None
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    matched_stop: str | None = None


FINISH_REASONS = {
    pb.FINISH_REASON_UNSPECIFIED: "unspecified",
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_CANCELLED: "cancelled",
    pb.FINISH_REASON_ERROR: "error",
    pb.FINISH_REASON_TOOL_CALLS: "tool_calls",
}


@dataclass
class Accumulator:
    """Collects one request's events into a `Completion`."""

    request_id: str = ""
    model: str | None = None
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    calls: dict[int, list[str]] = field(default_factory=dict)  # index -> [id, name, arguments]
    completion: Completion | None = None

    def delta(self, d: pb.Delta, request_id: str) -> Chunk:
        self.text.append(d.text)
        self.reasoning.append(d.reasoning)
        self.token_ids.extend(d.token_ids)
        for c in d.tool_calls:
            slot = self.calls.setdefault(c.index, ["", "", ""])
            slot[0] = slot[0] or c.id
            slot[1] = slot[1] or c.name
            slot[2] += c.arguments
        return Chunk(d.text, tuple(d.token_ids), d.reasoning, request_id)

    def finish(self, f: pb.Finish, request_id: str) -> Completion:
        """The completion; raises GyreError when the request failed."""
        if f.reason == pb.FINISH_REASON_ERROR:
            raise GyreError.from_request_error(f.error, request_id)
        self.completion = Completion(
            text="".join(self.text), token_ids=tuple(self.token_ids),
            finish_reason=FINISH_REASONS.get(f.reason, "unspecified"), usage=Usage.from_pb(f.usage),
            request_id=request_id, model=self.model, reasoning="".join(self.reasoning),
            tool_calls=tuple(ToolCall(*self.calls[i]) for i in sorted(self.calls)),
            matched_stop=f.matched_stop if f.HasField("matched_stop") else None)
        return self.completion


def model_from_metadata(md) -> str | None:
    for key, value in md or ():
        if key == "gyre-model":
            return value
    return None


# ---------------------------------------------------------------------------
# Requests


Prompt = Union[str, Sequence[int]]
Message = Union[Mapping[str, Any], pb.ChatMessage]

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "seed", "min_p", "presence_penalty", "frequency_penalty",
                   "repetition_penalty", "logit_bias")


def chat_message(m: Message) -> pb.ChatMessage:
    if isinstance(m, pb.ChatMessage):
        return m
    m = dict(m)
    calls = [pb.ToolCall(id=c.get("id", ""), type=c.get("type", ""),
                         function=pb.FunctionCall(**c.get("function", {}))) for c in m.pop("tool_calls", None) or ()]
    return pb.ChatMessage(tool_calls=calls, **{k: v for k, v in m.items() if v is not None})


def chat_input(messages: Iterable[Message], *, add_generation_prompt: bool | None = None,
               chat_template_kwargs: Mapping[str, Any] | None = None) -> pb.ChatInput:
    chat = pb.ChatInput(messages=[chat_message(m) for m in messages])
    if add_generation_prompt is not None:
        chat.add_generation_prompt = add_generation_prompt
    if chat_template_kwargs:
        s = struct_pb2.Struct()
        s.update(dict(chat_template_kwargs))
        chat.chat_template_kwargs.CopyFrom(s)
    return chat


def build_request(prompt: Prompt | None = None, *, messages: Iterable[Message] | None = None,
                  model: str | None = None, max_tokens: int | None = None, stop: Sequence[str] | None = None,
                  request_id: str = "", add_generation_prompt: bool | None = None,
                  chat_template_kwargs: Mapping[str, Any] | None = None, **kwargs: Any) -> pb.Request:
    """A `gyre.v1.Request`. The input is `prompt` (text, or token ids used
    verbatim) or chat `messages` (dicts like {"role": "user", "content": ...}
    or ChatMessage). Sampling parameters (temperature, top_p, top_k, seed,
    min_p, presence_penalty, frequency_penalty, repetition_penalty,
    logit_bias) may be given by name; any other field of `Request`
    (ignore_eos, priority, stop_token_ids, ...) too."""
    if (prompt is None) == (messages is None):
        raise ValueError("give exactly one of `prompt` (text or token ids) and `messages`")
    if kwargs.get("n") not in (None, 1):
        raise ValueError("the helpers read one choice per request: for n > 1 use the gyre.v1 stubs")
    req = pb.Request(request_id=request_id, model=model or "")
    if messages is not None:
        req.chat.CopyFrom(chat_input(messages, add_generation_prompt=add_generation_prompt,
                                     chat_template_kwargs=chat_template_kwargs))
    elif isinstance(prompt, str):
        req.text = prompt
    else:
        req.token_ids.ids.extend(int(t) for t in prompt)
    sampling = {k: kwargs.pop(k) for k in SAMPLING_FIELDS if kwargs.get(k) is not None}
    for k in SAMPLING_FIELDS:
        kwargs.pop(k, None)
    given = kwargs.pop("sampling", None)
    if given is not None:
        req.sampling.CopyFrom(given if isinstance(given, pb.SamplingParams) else pb.SamplingParams(**given))
    if sampling:
        req.sampling.MergeFrom(pb.SamplingParams(**sampling))
    if max_tokens is not None:
        req.max_tokens = max_tokens
    if stop:
        req.stop.extend([stop] if isinstance(stop, str) else stop)
    for k, v in kwargs.items():
        if v is None:
            continue
        if isinstance(v, (list, tuple)):
            getattr(req, k).extend(v)
        elif hasattr(v, "DESCRIPTOR"):
            getattr(req, k).CopyFrom(v)
        else:
            setattr(req, k, v)
    return req


def tokenize_request(text: str | None, messages: Iterable[Message] | None, model: str | None,
                     add_special_tokens: bool | None) -> pb.TokenizeRequest:
    if (text is None) == (messages is None):
        raise ValueError("give exactly one of `text` and `messages`")
    req = pb.TokenizeRequest(model=model or "")
    if messages is not None:
        req.chat.CopyFrom(chat_input(messages))
    else:
        req.text = text
    if add_special_tokens is not None:
        req.add_special_tokens = add_special_tokens
    return req


@dataclass(frozen=True)
class Tokens:
    """Token ids, the model's context length, and the text tokenized (for
    chat input, the rendered template)."""

    ids: tuple[int, ...]
    max_model_len: int
    prompt: str

    @classmethod
    def from_pb(cls, r: pb.TokenizeResponse) -> "Tokens":
        return cls(tuple(r.token_ids), r.max_model_len, r.prompt)


HEALTH_CHECK = "/grpc.health.v1.Health/Check"
HEALTH_STATUS = {v.number: v.name for v in wire.HealthCheckResponse.ServingStatus.DESCRIPTOR.values}
