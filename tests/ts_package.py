"""The TypeScript client package (`clients/typescript`, `gyre-client`) built
the way a fresh clone builds it, for tests/test_typescript_client.py (Node)
and tests/test_typescript_browser.py (a browser bundle).

clients/typescript and proto/ are copied without anything generated or
built, the package's npm dependencies (installed by `make clients-ts` into
clients/typescript/node_modules) linked in, then `npm run build` (buf
generate with protoc-gen-es from proto/, then tsc into dist/)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import harness

PKG = harness.REPO / "clients" / "typescript"
# What a build leaves in the package folder: not in a fresh clone.
NOT_IN_CLONE = shutil.ignore_patterns("node_modules", "dist", "gen")


def node() -> str:
    found = shutil.which("node")
    assert found, "node is not installed (make setup needs Node 20)"
    return found


def build_fresh(root: Path) -> Path:
    """The package built from a fresh copy under `root`; its folder."""
    deps = PKG / "node_modules"
    assert (deps / ".bin" / "tsc").exists(), "clients/typescript has no node_modules: run `make clients-ts`"
    pkg = root / "clients" / "typescript"
    shutil.copytree(PKG, pkg, ignore=NOT_IN_CLONE)
    shutil.copytree(harness.REPO / "proto" / "gyre", root / "proto" / "gyre")
    assert not (pkg / "src" / "gen").exists() and not (pkg / "dist").exists()
    (pkg / "node_modules").symlink_to(deps)
    npm = shutil.which("npm")
    assert npm, "npm is not installed"
    done = subprocess.run([npm, "run", "build"], cwd=pkg, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "npm_config_update_notifier": "false"})
    assert done.returncode == 0, f"npm run build:\n{done.stdout}\n{done.stderr}"
    # Generated from proto/ at build time, then compiled.
    for name in ("src/gen/gyre/v1/generate_pb.ts", "src/gen/grpc/health/v1/health_pb.ts",
                 "dist/gen/gyre/v1/generate_pb.js", "dist/node.js", "dist/node.d.ts", "dist/web.js",
                 "dist/index.js", "dist/index.d.ts"):
        assert (pkg / name).is_file(), f"{name} missing after npm run build"
    return pkg


def app_folder(folder: Path, pkg: Path) -> Path:
    """`folder` made an ESM app whose node_modules/gyre-client is `pkg`."""
    (folder / "node_modules").mkdir()
    (folder / "node_modules" / "gyre-client").symlink_to(pkg)
    (folder / "package.json").write_text('{"private": true, "type": "module"}')
    return folder
