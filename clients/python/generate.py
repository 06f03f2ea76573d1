"""Generates gyre's Python gRPC client from proto/ with grpcio-tools.

    python clients/python/generate.py            # writes clients/python/gyre/v1/*_pb2*.py

The output is a plain package: put clients/python on sys.path and
`from gyre.v1 import generate_pb2, generate_pb2_grpc`.
"""
import pathlib
import sys

import grpc_tools
from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = pathlib.Path(__file__).resolve().parent


def main() -> int:
    proto_dir = ROOT / "proto"
    protos = sorted(str(p.relative_to(proto_dir)) for p in proto_dir.rglob("*.proto"))
    # grpcio-tools ships the well-known types (google/protobuf/struct.proto).
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    args = ["protoc", f"-I{proto_dir}", f"-I{well_known}", f"--python_out={OUT}", f"--grpc_python_out={OUT}", f"--pyi_out={OUT}", *protos]
    rc = protoc.main(args)
    if rc != 0:
        return rc
    for pkg in ("gyre", "gyre/v1"):
        (OUT / pkg / "__init__.py").touch()
    print(f"generated {', '.join(protos)} -> {OUT}/gyre/v1")
    return 0


if __name__ == "__main__":
    sys.exit(main())
