"""Raw-socket helpers of the connection tests: HTTP/1.1 requests on a kept
connection, and a minimal HTTP/2 client (prior knowledge, hand-built frames,
HPACK literals only) that can leave PINGs unanswered and windows closed.
"""

from __future__ import annotations

import json
import socket
import struct
import time

import pytest

WAIT_S = 15.0  # how long a test waits for a timeout's effect


class Closed(Exception):
    """The server closed the connection."""


def connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=WAIT_S)


def wait_closed(sock: socket.socket, within: float = WAIT_S) -> bytes:
    """Reads until the server closes `sock` (EOF or reset); fails after `within` s."""
    deadline, data = time.monotonic() + within, b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"the connection was still open after {within:.0f} s (read {data[:200]!r})")
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return data
        except TimeoutError:
            continue
        if not chunk:
            return data
        data += chunk


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length body; `Closed` on EOF before it."""
    data = b""
    while b"\r\n\r\n" not in data:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError) as e:
            raise Closed(str(e)) from e
        if not chunk:
            raise Closed(f"EOF after {data!r}")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise Closed("EOF in the body")
        body += chunk
    return status, headers, body


def get(sock: socket.socket, path: str) -> tuple[int, dict[str, str], bytes]:
    """GET `path` on a kept-alive HTTP/1.1 connection."""
    try:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: gyre\r\n\r\n".encode())
    except (ConnectionResetError, BrokenPipeError) as e:
        raise Closed(str(e)) from e
    return read_response(sock)


# ---------------------------------------------------------------------------
# HTTP/2

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x4, 0x6, 0x7
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _hpack_int(value: int) -> bytes:
    """An HPACK integer with a 7-bit prefix (no Huffman flag)."""
    if value < 127:
        return bytes([value])
    out, value = [127], value - 127
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    return bytes(out + [value])


def hpack(headers: list[tuple[str, str]]) -> bytes:
    """A header block of literals without indexing (new names)."""
    out = b""
    for name, value in headers:
        n, v = name.encode(), value.encode()
        out += b"\x00" + _hpack_int(len(n)) + n + _hpack_int(len(v)) + v
    return out


class H2:
    """An HTTP/2 connection: preface, SETTINGS exchanged, then frames by hand."""

    def __init__(self, address: str):
        self.sock = connect(address)
        self.buf = b""
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
        while True:
            f = self.read_frame()
            if f is None:
                pytest.fail("the server closed the HTTP/2 connection during the handshake")
            if f[0] == SETTINGS and not f[1] & ACK:
                self.sock.sendall(frame(SETTINGS, ACK, 0))
                return

    def request(self, stream: int, method: str, path: str, headers: list[tuple[str, str]],
                body: bytes | None) -> None:
        pseudo = [(":method", method), (":scheme", "http"), (":path", path), (":authority", "gyre")]
        flags = END_HEADERS | (END_STREAM if body is None else 0)
        self.sock.sendall(frame(HEADERS, flags, stream, hpack(pseudo + headers)))
        if body:
            self.sock.sendall(frame(DATA, END_STREAM, stream, body))

    def read_frame(self, deadline: float | None = None) -> tuple[int, int, int, bytes] | None:
        """The next frame (kind, flags, stream, payload), or None once the server closed."""
        deadline = deadline or time.monotonic() + WAIT_S
        while True:
            if len(self.buf) >= 9:
                length = int.from_bytes(self.buf[:3], "big")
                if len(self.buf) >= 9 + length:
                    kind, flags = self.buf[3], self.buf[4]
                    stream = int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF
                    payload, self.buf = self.buf[9:9 + length], self.buf[9 + length:]
                    return kind, flags, stream, payload
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"no HTTP/2 frame and no close within {WAIT_S:.0f} s")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                return None
            except TimeoutError:
                continue
            if not chunk:
                return None
            self.buf += chunk

    def run_until_closed(self, answer_pings: bool) -> dict:
        """Reads frames until the server closes (failing after WAIT_S s): what was seen."""
        seen = {"pings": 0, "ended": set(), "goaway": False}
        deadline = time.monotonic() + WAIT_S
        while (f := self.read_frame(deadline)) is not None:
            kind, flags, stream, payload = f
            if kind == PING and not flags & ACK:
                seen["pings"] += 1
                if answer_pings:
                    self.sock.sendall(frame(PING, ACK, 0, payload))
            elif kind == GOAWAY:
                seen["goaway"] = True
            elif flags & END_STREAM and kind in (DATA, HEADERS):
                seen["ended"].add(stream)
        return seen


def grpc_headers() -> list[tuple[str, str]]:
    return [("content-type", "application/grpc"), ("te", "trailers")]


def json_headers(body: bytes) -> list[tuple[str, str]]:
    return [("content-type", "application/json"), ("content-length", str(len(body)))]


def json_body(payload: dict) -> bytes:
    return json.dumps(payload).encode()
