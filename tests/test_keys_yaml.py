"""A YAML keys file (`--keys-file keys.yaml`): the same schema and the same
behaviour as the TOML one, chosen by the file's extension.

A real `gyre serve` reads a block-style YAML file (comments, a tenant with
nothing under it, quoted and unquoted hashes) and enforces it on both
protocols: 401 / UNAUTHENTICATED for an unknown key, 403 /
PERMISSION_DENIED for a model outside the tenant's `models`, 429 /
RESOURCE_EXHAUSTED over requests per minute with the `x-ratelimit-*`
headers. The file reloads on change, and a bad YAML file keeps the old keys
(and fails a start, naming the problem).
"""

from __future__ import annotations

import subprocess

import pytest

import harness
from conftest import QWEN, assert_no_panic
from test_tenants import PROTOCOLS, assert_openai_error, generate, key_hash, status_of, wait_for


def yaml_file(tenants: dict[str, dict], keys: dict[str, str]) -> str:
    """Block-style YAML: `tenants` (name -> settings; none: a bare
    `name:`), `keys` (key -> tenant), hashes alternately quoted and not."""
    lines = ["# gyre keys file", "tenants:"]
    for name, settings in tenants.items():
        lines.append(f"  {name}:" + ("" if settings else "   # no limits"))
        for k, v in settings.items():
            value = "[" + ", ".join(v) + "]" if isinstance(v, list) else str(v)
            lines.append(f"    {k}: {value}")
    lines.append("keys:")
    for i, (key, tenant) in enumerate(keys.items()):
        digest = key_hash(key)
        lines += [f"  - sha256: {digest if i % 2 else repr(digest)}", f"    tenant: {tenant}"]
    return "\n".join(lines) + "\n"


TENANTS = {
    "free": {},
    "narrow": {"models": ["some-other-model"], "priority": 1, "weight": 2},
    **{f"rpm_{p}": {"requests_per_minute": 1} for p in PROTOCOLS},
}
KEYS = {f"key-{t}": t for t in TENANTS}


@pytest.fixture(scope="module")
def yaml_server(tmp_path_factory, module_server) -> harness.Server:
    path = tmp_path_factory.mktemp("keys") / "keys.yaml"
    path.write_text(yaml_file(TENANTS, KEYS))
    return module_server(QWEN, "--keys-file", str(path))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_yaml_keys_file_authenticates_on_both_protocols(yaml_server, protocol):
    assert_openai_error(generate(yaml_server, protocol, None), 401, "authentication_error", "invalid_api_key")
    assert_openai_error(generate(yaml_server, protocol, "key-nobody"), 401, "authentication_error",
                        "invalid_api_key")
    ok = generate(yaml_server, protocol, "key-free")
    assert ok.status == 200, ok.body
    assert ok.body["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_model_outside_the_yaml_tenants_list_is_403(yaml_server, protocol):
    refused = generate(yaml_server, protocol, "key-narrow")
    assert_openai_error(refused, 403, "permission_error", "model_not_allowed", "model")
    assert QWEN in refused.error["message"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_yaml_quota_gives_429_with_the_rate_limit_headers(yaml_server, protocol):
    key = f"key-rpm_{protocol}"
    ok = generate(yaml_server, protocol, key)
    assert ok.status == 200, ok.body
    assert ok.headers["x-ratelimit-limit-requests"] == "1", ok.headers
    assert ok.headers["x-ratelimit-remaining-requests"] == "0", ok.headers
    refused = generate(yaml_server, protocol, key)
    assert_openai_error(refused, 429, "rate_limit_error", "rate_limit_exceeded")
    assert "requests per minute" in refused.error["message"]
    assert refused.headers["x-ratelimit-limit-requests"] == "1", refused.headers
    if protocol == "http":
        assert 1 <= int(refused.headers["retry-after"]) <= 60, refused.headers


def test_a_yaml_keys_file_reloads_and_keeps_old_keys_when_bad(tmp_path, module_server):
    path = tmp_path / "keys.yml"
    path.write_text(yaml_file({"team": {}}, {"key-one": "team"}))
    server = module_server(QWEN, "--keys-file", str(path))
    assert status_of(server, "key-one") == (200, 200)
    assert status_of(server, "key-two") == (401, 401)

    path.write_text(yaml_file({"team": {"requests_per_minute": 50}}, {"key-two": "team"}))
    wait_for(lambda: generate(server, "http", "key-two").status == 200, "the rewritten YAML file to load")
    assert status_of(server, "key-one") == (401, 401)
    assert generate(server, "grpc", "key-two").headers["x-ratelimit-limit-requests"] == "50"

    # TOML-looking text is no valid YAML keys file: refused, logged, and the
    # keys stay as they were.
    failures = server.stderr().count("keys file reload failed")
    path.write_text('[[keys]]\nsha256 = "x"\ntenant = "team"\n')
    wait_for(lambda: server.stderr().count("keys file reload failed") > failures, "the bad file to be refused")
    why = server.stderr().rsplit("keys file reload failed", 1)[1].split("\n", 1)[0]
    assert "YAML" in why and str(path) in why, why
    assert status_of(server, "key-two") == (200, 200)
    assert "key-two" not in server.stderr(), "a key reached the log"
    assert_no_panic(server)


def test_a_bad_yaml_keys_file_fails_the_start_and_says_where(tmp_path):
    path = tmp_path / "keys.yaml"
    path.write_text(f"tenants:\n  team:\n    rpm: 3\nkeys:\n  - sha256: '{key_hash('k')}'\n    tenant: team\n")
    argv = [str(harness.GYRE_BIN), "serve", "--model", str(harness.model_dir(QWEN)),
            "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--keys-file", str(path)]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert p.returncode != 0
    assert "unknown field `rpm`" in p.stderr and "tenants.team" in p.stderr, p.stderr[-2000:]
    assert str(path) in p.stderr, p.stderr[-2000:]
    assert "listening" not in p.stdout
