"""Headless Chromium for the browser tests (tests/test_playground.py,
tests/test_typescript_browser.py): Debian's package, installed by `make
chromium`, driven by Playwright (the `playwright` package of
requirements-dev.txt, pointed at that Chromium; no browser is downloaded).
Either missing fails the test, saying how to install it: never a skip."""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import pytest

# Chromium as root in a container with no network: no sandbox (root), no
# GPU, and none of its background connections (refused here, slowly).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-features=Translate,MediaRouter"]


def chromium() -> str:
    path = os.environ.get("GYRE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(path).is_file():
        pytest.fail("Chromium is not installed: `make chromium` installs Debian's package "
                    "(apt-get install chromium), or set GYRE_CHROMIUM to a Chromium binary", pytrace=False)
    return path


def playwright_api():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the playwright Python package is missing: `make venv` installs requirements-dev.txt",
                    pytrace=False)
    return sync_playwright


def launch(p):
    """Chromium started by the Playwright `p`, or the test fails saying why."""
    executable = chromium()
    try:
        return p.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
    except Exception as e:  # noqa: BLE001 - say which browser failed, and how
        pytest.fail(f"Playwright could not start {executable}: {e}", pytrace=False)


def png_size(path: Path) -> tuple[int, int]:
    """The width and height of the PNG at `path` (which must be one)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height
