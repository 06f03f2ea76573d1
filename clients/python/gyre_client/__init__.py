"""gyre_client: a typed Python client of gyre's gRPC API, sync and asyncio.

    from gyre_client import Client

    with Client("127.0.0.1:50051") as c:
        r = c.generate("The capital of France is", max_tokens=8, temperature=0)
        print(r.text, r.usage.completion_tokens)

The generated modules are importable as `gyre.v1` (`generate_pb2`,
`generate_pb2_grpc`, ...) for anything the helpers do not cover.
"""
from ._async import AsyncClient, AsyncSession, AsyncSessionRequest, AsyncStream
from ._common import TLS, Chunk, Completion, GyreError, Tokens, ToolCall, Usage
from ._sync import Client, Session, SessionRequest, Stream

__all__ = ["Client", "AsyncClient", "Session", "AsyncSession", "SessionRequest", "AsyncSessionRequest", "Stream",
           "AsyncStream", "TLS", "Chunk", "Completion", "Usage", "ToolCall", "Tokens", "GyreError"]
__version__ = "0.1.0"
