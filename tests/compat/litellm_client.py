"""LiteLLM as a library against gyre (run by tests/test_litellm.py with the
compat venv's python): `python litellm_client.py BASE_URL MODEL`.

Calls `litellm.completion` through its `openai/` provider with `api_base`,
whole and streamed, and with an unknown model; prints one JSON object.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version

import litellm

BASE_URL, MODEL = sys.argv[1], sys.argv[2]
# No "Give Feedback / Get Help" banner on stdout with each exception.
litellm.suppress_debug_info = True
CASES = {
    "question": {"messages": [{"role": "user", "content": "What is the capital of France?"}]},
    "poem": {"messages": [{"role": "user", "content": "Write a poem about the sea."}], "max_tokens": 12},
}


def complete(model: str, **kw):
    return litellm.completion(model=f"openai/{model}", api_base=BASE_URL, api_key="unused", temperature=0,
                              num_retries=0, timeout=120, **kw)


def whole(kw: dict) -> dict:
    r = complete(MODEL, **kw)
    choice = r.choices[0]
    return {"content": choice.message.content, "finish": choice.finish_reason,
            "usage": [r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens]}


def streamed(kw: dict) -> dict:
    pieces, finish, usage = [], None, None
    for chunk in complete(MODEL, stream=True, stream_options={"include_usage": True}, **kw):
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
        if getattr(chunk, "usage", None):
            usage = [chunk.usage.prompt_tokens, chunk.usage.completion_tokens, chunk.usage.total_tokens]
    return {"content": "".join(pieces), "finish": finish, "pieces": pieces, "usage": usage}


def error() -> dict:
    try:
        complete("no-such-model", **CASES["question"])
    except Exception as e:  # noqa: BLE001 -- which class LiteLLM raised is what is tested
        return {"class": type(e).__name__, "not_found": isinstance(e, litellm.NotFoundError),
                "bad_request": isinstance(e, litellm.BadRequestError),
                "status": getattr(e, "status_code", None), "message": str(e)}
    return {"class": None}


def main() -> None:
    out = {"versions": {p: version(p) for p in ("litellm", "openai")}}
    for name, kw in CASES.items():
        out[name] = {"whole": whole(kw), "stream": streamed(kw)}
    out["error"] = error()
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
