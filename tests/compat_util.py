"""Running tools from the compatibility environment (`make compat`) against gyre.

LangChain and LiteLLM live in a venv of their own (requirements-compat.txt,
under ~/.cache/gyre/compat-venv, or $GYRE_COMPAT_VENV). The tests here run
small scripts (tests/compat/) with that venv's python; each script prints one
JSON object on stdout, which the test compares with what the OpenAI SDK of
the project's venv gets from gyre directly for the same request.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import openai
import pytest

import harness

COMPAT_VENV = harness._env_path("GYRE_COMPAT_VENV", Path.home() / ".cache/gyre/compat-venv")
REQUIREMENTS = harness.REPO / "requirements-compat.txt"
SCRIPTS = harness.REPO / "tests" / "compat"
# The real default model (make setup links it), served by its file's stem.
DEFAULT_GGUF = "smollm2-135m-instruct.gguf"
DEFAULT = "smollm2-135m-instruct"


def pinned(package: str) -> str:
    """The version requirements-compat.txt pins `package` to."""
    m = re.search(rf"^{re.escape(package)}==(\S+)", REQUIREMENTS.read_text(), re.MULTILINE | re.IGNORECASE)
    assert m, f"{package} is not pinned in {REQUIREMENTS}"
    return m.group(1)


def venv_bin(name: str) -> Path:
    """A program of the compat venv; fails (never skips) when the venv is missing."""
    path = COMPAT_VENV / "bin" / name
    if not (COMPAT_VENV / ".installed").exists() or not path.exists():
        pytest.fail(f"the compatibility environment is missing ({path} not found): run `make compat`",
                    pytrace=False)
    return path


def tool_env() -> dict[str, str]:
    """This environment for the tools, without any OpenAI or LiteLLM settings of
    the user's, and with LiteLLM's cost map read from its package instead of
    fetched from the network at import."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "LITELLM_"))}
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    return env


def run_script(script: str, *args: str, timeout: float = 300) -> dict:
    """Runs tests/compat/`script` with the compat venv's python; its JSON output."""
    py = venv_bin("python")
    try:
        p = subprocess.run([str(py), str(SCRIPTS / script), *args], capture_output=True, text=True,
                           timeout=timeout, cwd=harness.REPO, env=tool_env(), stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{script} did not finish in {timeout:.0f}s; stderr:\n{(e.stderr or b'')[-4000:]!r}",
                    pytrace=False)
    assert p.returncode == 0, f"{script} exited {p.returncode}; stderr:\n{p.stderr[-6000:]}"
    lines = p.stdout.strip().splitlines()
    assert lines, f"{script} printed nothing; stderr:\n{p.stderr[-6000:]}"
    return json.loads(lines[-1])  # the JSON object is the last line, whatever a tool printed before


def sdk(base_url: str, api_key: str = "unused") -> openai.OpenAI:
    """The project's OpenAI SDK: the reference every tool's answer must equal."""
    return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)


def usage_counts(usage) -> tuple[int, int, int]:
    return usage.prompt_tokens, usage.completion_tokens, usage.total_tokens
