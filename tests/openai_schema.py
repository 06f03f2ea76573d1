"""Validation of HTTP responses against the official OpenAI OpenAPI spec.

The spec (`tests/data/openai/openapi.yaml`, or `$OPENAI_SPEC`) is an
OpenAPI 3.1 document that still marks optional-null fields with OpenAPI 3.0's
`nullable: true`, which a JSON Schema 2020-12 validator ignores. Loading it
rewrites every `{..., "nullable": true}` as `{"anyOf": [{...}, {"type": "null"}]}`
and registers the whole document as one resource, so `$ref`s such as
`#/components/schemas/CompletionUsage` resolve against it.

One deliberate relaxation, matching what the real API sends: streamed legacy
completion chunks (`CompletionChunk` below) are `CreateCompletionResponse`
with `finish_reason` and `usage` allowed to be null (every chunk but the last
carries `finish_reason: null`; with `include_usage`, `usage: null` until the
usage chunk, exactly as chat chunks do).

A second one for `echo` with `logprobs`: the first prompt token has no
log-probability, so its entries in the legacy listing's `token_logprobs` and
`top_logprobs` are null, as the real API and vLLM send them (the spec's item
types say number / object); only those two arrays' items are made nullable.
"""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path

import jsonschema
import yaml
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SPEC_PATH = Path(os.environ.get(
    "OPENAI_SPEC", str(Path(__file__).resolve().parent / "data" / "openai" / "openapi.yaml")))
SPEC_URI = "urn:openai:openapi"

#: Names of the schemas the tests validate against.
CHAT = "CreateChatCompletionResponse"
CHAT_CHUNK = "CreateChatCompletionStreamResponse"
COMPLETION = "CreateCompletionResponse"
COMPLETION_CHUNK = "CompletionChunk"  # synthetic, see the module docstring
MODEL_LIST = "ListModelsResponse"
MODEL = "Model"
ERROR = "ErrorResponse"


def _rewrite_nullable(node):
    """Returns `node` with OpenAPI 3.0 `nullable: true` turned into JSON Schema."""
    if isinstance(node, list):
        return [_rewrite_nullable(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _rewrite_nullable(v) for k, v in node.items() if k != "nullable"}
    if node.get("nullable") is True:
        return {"anyOf": [out, {"type": "null"}]}
    return out


def _nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


@functools.lru_cache(maxsize=1)
def _spec() -> dict:
    if not SPEC_PATH.is_file():
        raise FileNotFoundError(f"OpenAI spec not found at {SPEC_PATH} (set OPENAI_SPEC)")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with SPEC_PATH.open(encoding="utf-8") as f:
        doc = yaml.load(f, Loader=loader)
    doc = _rewrite_nullable(doc)
    schemas = doc["components"]["schemas"]
    listing = schemas[COMPLETION]["properties"]["choices"]["items"]["properties"]["logprobs"]["anyOf"][0]
    for name in ("token_logprobs", "top_logprobs"):
        listing["properties"][name]["items"] = _nullable(listing["properties"][name]["items"])
    chunk = copy.deepcopy(schemas[COMPLETION])
    choice = chunk["properties"]["choices"]["items"]["properties"]
    choice["finish_reason"] = _nullable(choice["finish_reason"])
    chunk["properties"]["usage"] = _nullable(chunk["properties"]["usage"])
    schemas[COMPLETION_CHUNK] = chunk
    return doc


@functools.lru_cache(maxsize=None)
def validator(name: str) -> jsonschema.protocols.Validator:
    """A 2020-12 validator for `components.schemas[name]` of the spec."""
    doc = _spec()
    if name not in doc["components"]["schemas"]:
        raise KeyError(f"no schema {name!r} in {SPEC_PATH}")
    registry = Registry().with_resource(SPEC_URI, Resource.from_contents(doc, DRAFT202012))
    schema = {"$ref": f"{SPEC_URI}#/components/schemas/{name}"}
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validate(name: str, instance) -> None:
    """Fails with every violation listed when `instance` does not match `name`."""
    errors = sorted(validator(name).iter_errors(instance), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [
            f"  at /{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}" for e in errors[:10]
        ]
        raise AssertionError(
            f"response does not match OpenAI schema {name}:\n" + "\n".join(lines) + f"\n{instance!r:.2000}"
        )
