"""Builds HuggingFace hub caches in a temporary directory, laid out exactly as
`huggingface_hub` lays them out, from the tiny fixture models:

    <hub>/models--<org>--<name>/blobs/<sha256>            the files' bytes
    <hub>/models--<org>--<name>/snapshots/<commit>/<file>  relative links to blobs
    <hub>/models--<org>--<name>/refs/<revision>            a commit hash

The tests check that `huggingface_hub` and transformers accept what is built
here before gyre is asked to serve from it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import harness

# A model's files that a hub repository holds (golden.json is the tests' own).
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


def commit_of(label: str) -> str:
    """A stable 40-hex commit hash for `label`."""
    return hashlib.sha1(label.encode()).hexdigest()


def repo_dir(hub: Path, repo_id: str) -> Path:
    return hub / ("models--" + repo_id.replace("/", "--"))


def add_snapshot(hub: Path, repo_id: str, commit: str, files: dict[str, bytes],
                 refs: tuple[str, ...] = ("main",)) -> Path:
    """Stores `files` as blobs, links them from `snapshots/<commit>/` and points
    each of `refs` at `commit`. Returns the snapshot directory."""
    repo = repo_dir(hub, repo_id)
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        ref_file = repo / "refs" / ref
        ref_file.parent.mkdir(parents=True, exist_ok=True)
        ref_file.write_text(commit)
    return snapshot


def sharded_model_files(model: str, shards: int = 2) -> dict[str, bytes]:
    """A fixture model's files with its weights split into `shards`
    safetensors files and the index transformers writes beside them."""
    from safetensors.torch import load_file, save

    src = harness.model_dir(model)
    files = {name: (src / name).read_bytes() for name in MODEL_FILES}
    tensors = load_file(str(src / "model.safetensors"))
    names = sorted(tensors)
    weight_map, total = {}, 0
    for i in range(shards):
        part = names[i::shards]
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        files[fname] = save({n: tensors[n].contiguous() for n in part}, metadata={"format": "pt"})
        for n in part:
            weight_map[n] = fname
            total += tensors[n].numel() * tensors[n].element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    files["model.safetensors.index.json"] = json.dumps(index, indent=2).encode()
    return files


def hub_env(hf_home: Path) -> dict[str, str]:
    """This process's environment with the HuggingFace cache at `hf_home`/hub
    (offline, no other cache variable left to override it)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE")}
    env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1")
    return env
