"""Generates gyre's Python gRPC modules from proto/ with grpcio-tools.

    python clients/python/generate.py            # writes clients/python/gyre/v1/*_pb2*.py

The output is a plain package: put clients/python on sys.path and
`from gyre.v1 import generate_pb2, generate_pb2_grpc`. It also writes
`gyre_client/_wire_pb2.py` (the few foreign messages the `gyre_client`
helpers decode: error details and health). The package build
(`setup.py`) runs the same code, so `pip install ./clients/python` ships
what this writes.
"""
from __future__ import annotations

import os
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent


def find_proto_dir() -> pathlib.Path:
    """The directory holding gyre/v1/*.proto: $GYRE_PROTO_DIR, else the copy
    an sdist carries (clients/python/proto), else the repository's proto/."""
    candidates = [os.environ.get("GYRE_PROTO_DIR"), HERE / "proto", HERE.parents[1] / "proto"]
    for c in candidates:
        if c and (pathlib.Path(c) / "gyre" / "v1" / "generate.proto").is_file():
            return pathlib.Path(c).resolve()
    raise FileNotFoundError(
        "gyre's proto files (gyre/v1/*.proto) not found: build from a gyre checkout "
        "(clients/python beside ../../proto), from an sdist, or set GYRE_PROTO_DIR")


def generate(out: pathlib.Path = HERE, proto_dir: pathlib.Path | None = None) -> list[str]:
    """Writes the generated modules under `out`; returns the proto files compiled."""
    import grpc_tools
    from grpc_tools import protoc

    proto_dir = proto_dir or find_proto_dir()
    protos = sorted(str(p.relative_to(proto_dir)) for p in proto_dir.rglob("*.proto"))
    # grpcio-tools ships the well-known types (google/protobuf/struct.proto).
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    out.mkdir(parents=True, exist_ok=True)
    args = ["protoc", f"-I{proto_dir}", f"-I{well_known}", f"--python_out={out}", f"--grpc_python_out={out}",
            f"--pyi_out={out}", *protos]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {proto_dir}")
    for pkg in ("gyre", "gyre/v1"):
        (out / pkg / "__init__.py").touch()
    # The client's own small proto (no services): messages only.
    wire = ["protoc", f"-I{HERE}", f"--python_out={out}", f"--pyi_out={out}", "gyre_client/_wire.proto"]
    if protoc.main(wire) != 0:
        raise RuntimeError("protoc failed on gyre_client/_wire.proto")
    return protos


def main() -> int:
    try:
        protos = generate()
    except (FileNotFoundError, RuntimeError) as e:
        print(e, file=sys.stderr)
        return 1
    print(f"generated {', '.join(protos)} -> {HERE}/gyre/v1")
    return 0


if __name__ == "__main__":
    sys.exit(main())
