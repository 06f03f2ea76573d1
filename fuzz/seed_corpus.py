"""Writes the seed corpus of gyre's fuzz targets (fuzz/corpus/<target>/).

Run from fuzz/ with the project's Python after `make models` (the detok
seeds are real token ids of the fixture models' tokenizers):
    ../.venv/bin/python seed_corpus.py
`make test-fuzz` reads these seeds and keeps what libFuzzer finds in a
cache folder, so only the seeds are checked in.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tokenizers import Tokenizer

CORPUS = Path(__file__).resolve().parent / "corpus"
MODELS = Path(os.environ.get("GYRE_FUZZ_MODELS", Path(__file__).resolve().parent.parent / ".gyre" / "models"))


def put(target: str, name: str, data: bytes | str) -> None:
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"seed-{name}").write_bytes(data if isinstance(data, bytes) else data.encode())


MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
TOOL = {"type": "function", "function": {"name": "get", "description": "d", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
REQUESTS = {
    "chat_basic": {"model": "m", "messages": MSGS, "max_tokens": 8, "temperature": 0.7, "top_p": 0.9, "seed": 1},
    "chat_stream_usage": {"model": "m", "messages": MSGS, "stream": True, "stream_options": {"include_usage": True},
                          "n": 2, "stop": ["\n", "END"]},
    "chat_tools": {"model": "m", "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
        "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "get"}},
        "parallel_tool_calls": False},
    "chat_response_format": {"model": "m", "messages": MSGS, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"a": {"type": "integer"}}}}}},
    "chat_logprobs_kwargs": {"model": "m", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        "logprobs": True, "top_logprobs": 3, "logit_bias": {"5": -100},
        "chat_template_kwargs": {"enable_thinking": False, "x": {"y": [1, 2, {"z": None}]}},
        "continue_final_message": False, "add_generation_prompt": True},
    "chat_nvext": {"model": "m", "messages": MSGS, "stream": True, "top_k": 5, "min_p": 0.1,
                   "repetition_penalty": 1.1, "nvext": {"greedy_sampling": True, "use_raw_prompt": True,
                                                         "annotations": ["formatted_prompt", "token_ids"]}},
    "chat_guided": {"model": "m", "messages": MSGS, "guided_choice": ["yes", "no"],
                    "structured_outputs": {"regex": "[a-z]+"}},
    "completion_basic": {"model": "m", "prompt": "Once upon", "max_tokens": 5, "logprobs": 2, "echo": True},
    "completion_batch": {"model": "m", "prompt": [[1, 2, 3], [4, 5]], "n": 3, "best_of": 1, "stream": True},
    "completion_strings": {"model": "m", "prompt": ["a", "b"], "stop": "x", "max_tokens": 3, "ignore_eos": True,
                           "min_tokens": 2, "priority": 1, "cache_salt": "s"},
    "completion_bad_types": {"model": 5, "prompt": {"a": 1}, "max_tokens": "ten", "n": 1.5},
}
RAW_REQUESTS = {
    "not_json": b'{"model": "m", "messages": [',
    "array": b"[1, 2, 3]",
    "unicode": '{"model": "\u00e9\u6f22\U0001F600", "prompt": "\\ud800 lone surrogate"}'.encode(),
}

# (format index: hermes mistral deepseek llama3_json json, text)
TOOL_OUTPUTS = {
    "hermes_two": (0, 'Sure.<tool_call>\n{"name": "get", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
                      '<tool_call>{"name": "f", "arguments": "{}"}</tool_call>'),
    "hermes_unfinished": (0, 'x <tool_call>{"name": "get", "arguments": {"a": [1, 2'),
    "mistral_list": (1, 'Ok [TOOL_CALLS][{"name": "get", "arguments": {"city": "Paris"}}, {"name": "h", "arguments": {}}]'),
    "mistral_args": (1, '[TOOL_CALLS]get[ARGS]{"city": "Rome"}[TOOL_CALLS]h[ARGS]{}'),
    "deepseek_v31": (2, 'hi<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get<｜tool▁sep｜>{"city": "Oslo"}'
                        '<｜tool▁call▁end｜><｜tool▁calls▁end｜>'),
    "deepseek_v3": (2, '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get\n```json\n'
                       '{"city": "Oslo"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'),
    "llama3_tag": (3, '<|python_tag|>{"name": "get", "parameters": {"city": "Oslo"}}; {"name": "h", "parameters": {}}'),
    "llama3_text": (3, "  The answer is {not a call}"),
    "json_list": (4, ' [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "parameters": null}]'),
    "json_string_args": (4, '{"name": "a", "arguments": "{\\"x\\": 1}"}'),
    "json_semicolons": (4, '{"name": "a", "arguments": {"s": "}{\\"]"}}; {"name": "b", "arguments": {}} tail'),
    "mistral_unfinished": (1, '[TOOL_CALLS][{"name": "get", "arguments": {"q": ["a", {"b": "'),
    "deepseek_unfinished": (2, '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get<｜tool▁sep｜>{"city": "Os'),
}

# (parser index: think deepseek_r1 mistral, prompt opened the section, text)
REASONING = {
    "think_closed": (0, False, "  <think>\nstep 1\nstep 2</think>\n\nThe answer."),
    "think_open": (0, True, "thinking...</think>answer <think>not again</think>"),
    "think_none": (0, False, "Plain <thi answer"),
    "think_unclosed": (0, False, "<think>never ends </thin"),
    "r1": (1, False, "hmm</think>ok"),
    "mistral": (2, False, "[THINK]ponder[/THINK]done [/THINK]"),
    "mistral_open": (2, True, "ponder [/THI"),
}

DETOK_TEXTS = ["Hello, world! How are you?", "漢字とかな 🍷🎉 naïve café", "  leading  spaces\n\ttabs\n",
               "def f(x):\n    return x ** 2\n"]


def ids_bytes(ids: list[int]) -> bytes:
    return b"".join(i.to_bytes(3, "little") for i in ids)


def main() -> None:
    for name, body in REQUESTS.items():
        put("request", name, json.dumps(body, ensure_ascii=False))
    for name, raw in RAW_REQUESTS.items():
        put("request", name, raw)
    for i, (name, (fmt, text)) in enumerate(TOOL_OUTPUTS.items()):
        put("tool_calls", name, bytes([fmt, 7 * i + 3]) + text.encode())
    for i, (name, (parser, opened, text)) in enumerate(REASONING.items()):
        put("reasoning", name, bytes([parser << 1 | int(opened), 5 * i + 1]) + text.encode())
    for t_i, model in enumerate(["tiny-qwen2", "tiny-mistral"]):
        tok = Tokenizer.from_file(str(MODELS / model / "tokenizer.json"))
        special = sorted(tok.get_added_tokens_decoder())[:6]
        mixed = (tok.encode("a b", add_special_tokens=False).ids + special
                 + tok.encode(" c d 漢", add_special_tokens=False).ids)
        for skip in (0, 1):
            flags = bytes([t_i | skip << 1])
            for j, text in enumerate(DETOK_TEXTS):
                put("detok", f"{model}_{j}_skip{skip}", flags + ids_bytes(tok.encode(text).ids))
            put("detok", f"{model}_special_skip{skip}", flags + ids_bytes(mixed))


if __name__ == "__main__":
    main()
