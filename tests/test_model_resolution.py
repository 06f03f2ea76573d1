"""`--model` as a hub id, resolved offline from the local HuggingFace cache.

A real cache layout (blobs, snapshot links, refs) is built in a temporary
`HF_HOME` from the tiny fixture models (`hf_cache.py`); `huggingface_hub` and
transformers must see it as a cache before `gyre serve --model <org/name>`
serves it and answers exactly as transformers did (the fixture's golden
greedy continuation). Each way resolution can fail is a clear error that
says where it looked, with a non-zero exit and no panic.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import openai
import pytest

import harness
import hf_cache

REPO_ID = "gyre-test/tiny-qwen2"
COMMIT = hf_cache.commit_of("tiny-qwen2 main")
LLAMA_COMMIT = hf_cache.commit_of("tiny-llama v-llama")
MISSING_COMMIT = hf_cache.commit_of("never downloaded")


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory) -> Path:
    """An HF_HOME whose hub cache holds REPO_ID (main: tiny-qwen2 in two
    shards; tag `v-llama`: tiny-llama) and broken repositories for the
    error cases."""
    home = tmp_path_factory.mktemp("hf-home")
    hub = home / "hub"
    hf_cache.add_snapshot(hub, REPO_ID, COMMIT, hf_cache.sharded_model_files("tiny-qwen2"))
    llama = harness.model_dir("tiny-llama")
    llama_files = {n: (llama / n).read_bytes() for n in (*hf_cache.MODEL_FILES, "model.safetensors")}
    hf_cache.add_snapshot(hub, REPO_ID, LLAMA_COMMIT, llama_files, refs=("v-llama",))

    qwen = harness.model_dir("tiny-qwen2")
    config = (qwen / "config.json").read_bytes()
    weights = (qwen / "model.safetensors").read_bytes()
    tokenizer = (qwen / "tokenizer.json").read_bytes()
    hf_cache.add_snapshot(hub, "gyre-test/no-config", COMMIT,
                          {"model.safetensors": weights, "tokenizer.json": tokenizer})
    hf_cache.add_snapshot(hub, "gyre-test/no-weights", COMMIT,
                          {"config.json": config, "pytorch_model.bin": b"not safetensors"})
    broken = hf_cache.add_snapshot(hub, "gyre-test/broken", COMMIT,
                                   {"config.json": config, "model.safetensors": weights})
    (broken / "model.safetensors").resolve().unlink()
    dangling = hf_cache.repo_dir(hub, "gyre-test/dangling")
    (dangling / "refs").mkdir(parents=True)
    (dangling / "refs" / "main").write_text(MISSING_COMMIT)
    (dangling / "snapshots").mkdir()
    return home


CHECK_CACHE = r"""
import json, sys
from huggingface_hub import scan_cache_dir, snapshot_download
from transformers import AutoConfig

repo_id = sys.argv[1]
info = scan_cache_dir()
repo = next(r for r in info.repos if r.repo_id == repo_id)
print(json.dumps({
    "type": repo.repo_type,
    "revisions": {r.commit_hash: sorted(r.refs) for r in repo.revisions},
    "files": {r.commit_hash: sorted(f.file_name for f in r.files) for r in repo.revisions},
    "snapshot": snapshot_download(repo_id, local_files_only=True),
    "model_type": AutoConfig.from_pretrained(repo_id, local_files_only=True).model_type,
    "llama_type": AutoConfig.from_pretrained(repo_id, revision="v-llama", local_files_only=True).model_type,
}))
"""


def test_the_built_cache_is_a_real_huggingface_cache(hf_home):
    p = subprocess.run([sys.executable, "-c", CHECK_CACHE, REPO_ID], env=hf_cache.hub_env(hf_home),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    seen = json.loads(p.stdout)
    assert seen["type"] == "model"
    assert seen["revisions"] == {COMMIT: ["main"], LLAMA_COMMIT: ["v-llama"]}
    assert "model-00002-of-00002.safetensors" in seen["files"][COMMIT]
    assert Path(seen["snapshot"]) == hf_cache.repo_dir(hf_home / "hub", REPO_ID) / "snapshots" / COMMIT
    assert (seen["model_type"], seen["llama_type"]) == ("qwen2", "llama")


def serve_id(hf_home: Path, *flags: str, cwd: Path | None = None) -> harness.Server:
    argv = [str(harness.GYRE_BIN), "serve", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0",
            *flags]
    return harness.Server.start(argv, env=hf_cache.hub_env(hf_home), cwd=cwd)


def stopped(server: harness.Server) -> str:
    server.stop()
    log = server.stderr()
    server.remove_log()
    assert "panicked" not in log, log[-4000:]
    return log


def test_serve_by_hub_id_answers_like_transformers(hf_home):
    server = serve_id(hf_home, "--model", REPO_ID)
    try:
        gold = harness.golden("tiny-qwen2")
        client = openai.OpenAI(base_url=f"http://{server.http}/v1", api_key="unused", max_retries=0,
                               timeout=120)
        assert [m.id for m in client.models.list().data] == [REPO_ID]
        r = client.completions.create(model=REPO_ID, prompt=gold["prompt_ids"],
                                      max_tokens=len(gold["greedy_ids"]), temperature=0,
                                      extra_body={"ignore_eos": True})
        assert r.choices[0].text == gold["greedy_text"]
    finally:
        log = stopped(server)
    snapshot = hf_cache.repo_dir(hf_home / "hub", REPO_ID) / "snapshots" / COMMIT
    assert "model found in the HuggingFace cache" in log
    assert f"commit={COMMIT}" in log and str(snapshot) in log


def test_a_revision_picks_its_snapshot(hf_home):
    for revision in ("v-llama", LLAMA_COMMIT):
        server = serve_id(hf_home, "--model", REPO_ID, "--revision", revision)
        try:
            reply = harness.http_json(server.http, "/v1/models")
            assert [m["id"] for m in reply.json()["data"]] == [REPO_ID]
        finally:
            log = stopped(server)
        assert "architecture=LlamaForCausalLM" in log, log[-2000:]
        assert f"revision={revision} commit={LLAMA_COMMIT}" in log


def test_an_existing_local_path_wins_over_a_hub_id(hf_home, tmp_path):
    local = tmp_path / "gyre-test"
    local.mkdir()
    (local / "tiny-qwen2").symlink_to(harness.model_dir("tiny-llama"))
    server = serve_id(hf_home, "--model", REPO_ID, cwd=tmp_path)
    try:
        reply = harness.http_json(server.http, "/v1/models")
        assert [m["id"] for m in reply.json()["data"]] == ["tiny-qwen2"]
    finally:
        log = stopped(server)
    assert "architecture=LlamaForCausalLM" in log
    assert "HuggingFace cache" not in log


def fails(hf_home: Path, *flags: str, env: dict | None = None) -> str:
    """Runs `gyre grpc` that must fail before serving; returns its stderr."""
    argv = [str(harness.GYRE_BIN), "grpc", "--grpc-addr", "127.0.0.1:0", *flags]
    p = subprocess.run(argv, env=env or hf_cache.hub_env(hf_home), cwd=harness.REPO, capture_output=True,
                       text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode != 0, f"{argv} succeeded: {p.stdout}"
    assert "listening" not in p.stdout
    assert "panicked" not in p.stderr, p.stderr
    return p.stderr


def test_an_uncached_hub_id_says_where_it_looked(hf_home):
    err = fails(hf_home, "--model", "gyre-test/absent")
    looked = hf_cache.repo_dir(hf_home / "hub", "gyre-test/absent")
    assert f"{looked} does not exist" in err, err
    assert "no such file or directory" in err and "gyre does not download" in err


def test_hf_hub_cache_overrides_hf_home(hf_home, tmp_path):
    env = {**hf_cache.hub_env(hf_home), "HF_HUB_CACHE": str(tmp_path / "elsewhere")}
    err = fails(hf_home, "--model", REPO_ID, env=env)
    assert str(tmp_path / "elsewhere" / "models--gyre-test--tiny-qwen2") in err, err


def test_an_unknown_revision_lists_what_is_cached(hf_home):
    err = fails(hf_home, "--model", REPO_ID, "--revision", "nope")
    repo = hf_cache.repo_dir(hf_home / "hub", REPO_ID)
    assert f"revision `nope` is neither a ref in {repo / 'refs'} nor a snapshot in {repo / 'snapshots'}" in err
    assert COMMIT in err and LLAMA_COMMIT in err


def test_a_ref_to_a_missing_snapshot_names_it(hf_home):
    err = fails(hf_home, "--model", "gyre-test/dangling")
    repo = hf_cache.repo_dir(hf_home / "hub", "gyre-test/dangling")
    assert f"{repo / 'refs' / 'main'} names commit {MISSING_COMMIT}" in err, err
    assert f"{repo / 'snapshots' / MISSING_COMMIT} is not in the cache" in err


@pytest.mark.parametrize("repo_id, why", [
    ("gyre-test/no-config", "has no config.json"),
    ("gyre-test/no-weights", "has no *.safetensors weights"),
    ("gyre-test/broken", "links to weights whose blobs are missing (model.safetensors)"),
])
def test_an_incomplete_snapshot_says_what_it_lacks(hf_home, repo_id, why):
    err = fails(hf_home, "--model", repo_id)
    snapshot = hf_cache.repo_dir(hf_home / "hub", repo_id) / "snapshots" / COMMIT
    assert f"the cached snapshot {snapshot} {why}" in err, err


def test_revision_is_for_hub_ids_only(hf_home):
    model = str(harness.model_dir("tiny-qwen2"))
    err = fails(hf_home, "--model", model, "--revision", "main")
    assert f"--revision applies to hub ids only; {model} is a local path" in err


def test_a_missing_path_is_not_taken_for_a_hub_id(hf_home):
    err = fails(hf_home, "--model", "./absent/model.gguf")
    assert "--model ./absent/model.gguf: no such file or directory (--model takes a GGUF file" in err
    assert "models--" not in err, "a path was looked up in the hub cache"
