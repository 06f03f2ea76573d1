"""The conversation matrix of the chat-template parity test, and the
reference render of each case by transformers' own `apply_chat_template`.

Cases are written as an OpenAI client sends them (tool-call arguments as
JSON text, `content: null` beside tool calls). `normalise` is the rule gyre
documents (README, `service/src/chat.rs`), written out again here in Python:
arguments JSON text -> the parsed value (empty text -> {}); `content` null
or absent -> ""; tools in OpenAI's function-tool shape. transformers renders
the normalised messages; gyre gets the wire form and must normalise on its
own to render the same bytes.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime, timezone
from pathlib import Path

import harness

TEMPLATES = harness.REPO / "tests" / "data" / "chat-templates"

# The special tokens of each template's model (as its tokenizer_config.json
# has them), passed as template variables on both sides.
LLAMA3 = ("<|begin_of_text|>", "<|eot_id|>")
QWEN = ("", "<|im_end|>")
MISTRAL = ("<s>", "</s>")
DEEPSEEK = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>")
SPECIAL_TOKENS = {
    "command-r7b-12-2024-tool_use": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
    "deepseek-r1-distill-llama-8b": DEEPSEEK,
    "deepseek-r1-distill-qwen-14b": DEEPSEEK,
    "deepseek-r1-distill-qwen-32b": DEEPSEEK,
    "deepseek-v3.1": DEEPSEEK,
    "functionary-medium-v3.2": LLAMA3,
    "gemma-2-2b-it": ("<bos>", "<eos>"),
    "gemma-3-it": ("<bos>", "<eos>"),
    "gpt-oss-120b": ("<|startoftext|>", "<|return|>"),
    "granite-3.3-2b-instruct": ("<|end_of_text|>", "<|end_of_text|>"),
    "hermes-2-pro-llama-3-8b-tool_use": ("<|begin_of_text|>", "<|im_end|>"),
    "hermes-3-llama-3.1-8b-tool_use": ("<|begin_of_text|>", "<|im_end|>"),
    "llama-3.1-8b-instruct": LLAMA3,
    "llama-3.2-3b-instruct": LLAMA3,
    "llama-3.3-70b-instruct": LLAMA3,
    "mistral-7b-instruct-v0.3": MISTRAL,
    "mistral-nemo-instruct-2407": MISTRAL,
    "mistral-small-3.2-24b-instruct-2506": MISTRAL,
    "phi-3-mini-instruct": ("<s>", "<|endoftext|>"),
    "phi-3.5-mini-instruct": ("<s>", "<|endoftext|>"),
    "phi-4": ("<|endoftext|>", "<|im_end|>"),
    "phi-4-mini-instruct": ("<|endoftext|>", "<|endoftext|>"),
    "qwen2.5-7b-instruct": QWEN,
    "qwen3-0.6b": QWEN,
    "qwen3-30b-a3b": QWEN,
    "qwen3-coder": QWEN,
    "qwq-32b": QWEN,
    "smollm3-3b": ("", "<|im_end|>"),
}

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["query"],
        },
    },
}
TOOLS = [WEATHER, SEARCH]

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER = {"role": "user", "content": "What is the weather in Paris?"}


def call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# Mistral's templates want 9-character alphanumeric call ids.
ONE_CALL = [
    USER,
    {"role": "assistant", "content": None,
     "tool_calls": [call("call0001a", "get_weather", '{"city": "Paris", "unit": "celsius"}')]},
    {"role": "tool", "tool_call_id": "call0001a", "content": '{"temperature": 21, "sky": "clear"}'},
]
TWO_CALLS = [
    SYSTEM,
    {"role": "user", "content": "Weather in Paris and news about it?"},
    {"role": "assistant", "content": None, "tool_calls": [
        call("call0002b", "get_weather", '{"city": "Paris"}'),
        call("call0003c", "search", '{"query": "Paris news", "limit": 3}'),
    ]},
    {"role": "tool", "tool_call_id": "call0002b", "content": "21 C, clear"},
    {"role": "tool", "tool_call_id": "call0003c", "content": "No news today."},
    {"role": "assistant", "content": "It is 21 C and clear; no news."},
    {"role": "user", "content": "Thanks! And tomorrow?"},
]

# name -> (messages, options); options: tools, add_generation_prompt,
# continue_final_message, kwargs (chat_template_kwargs).
CASES: dict[str, tuple[list[dict], dict]] = {
    "user": ([USER], {}),
    "system+user": ([SYSTEM, USER], {}),
    "multi-turn": ([SYSTEM, USER, {"role": "assistant", "content": "Sunny, 21 C."},
                    {"role": "user", "content": "And in Rome?"}], {}),
    "no-generation-prompt": ([USER, {"role": "assistant", "content": "Sunny, 21 C."}],
                             {"add_generation_prompt": False}),
    "continue-final-message": ([USER, {"role": "assistant", "content": "The weather in Paris is"}],
                               {"add_generation_prompt": False, "continue_final_message": True}),
    "tools": ([SYSTEM, USER], {"tools": TOOLS}),
    "tools-no-system": ([USER], {"tools": TOOLS}),
    "tool-call+result": (ONE_CALL, {"tools": TOOLS}),
    "parallel-calls+multi-turn": (TWO_CALLS, {"tools": TOOLS}),
    "tool-history-without-tools": (ONE_CALL, {}),
    "reasoning-history": ([USER, {"role": "assistant", "content": "Sunny.",
                                  "reasoning_content": "The user wants weather."},
                           {"role": "user", "content": "Sure?"}], {}),
    "enable_thinking=false": ([USER], {"kwargs": {"enable_thinking": False}}),
    "thinking=true,reasoning_effort=high": ([SYSTEM, USER],
                                            {"kwargs": {"thinking": True, "reasoning_effort": "high"}}),
}


def normalise(messages: list[dict]) -> list[dict]:
    """The documented wire -> template rule, in Python."""
    out = copy.deepcopy(messages)
    for m in out:
        for c in m.get("tool_calls") or []:
            text = c["function"]["arguments"]
            c["function"]["arguments"] = json.loads(text) if text.strip() else {}
        if m.get("content") is None:
            m["content"] = ""
    return out


class _UtcClock(datetime):
    """`datetime` whose now() is UTC, as gyre's strftime_now is."""

    @classmethod
    def now(cls, tz=None):
        return datetime.now(tz or timezone.utc)


def reference_renderer():
    """A function rendering (template, case) with transformers, returning
    ("ok", text), ("raised", the template's raise_exception message) or
    ("failed", a Python error: undefined attribute, type error, ...)."""
    import jinja2
    import transformers.utils.chat_template_utils as ctu
    from transformers import AutoTokenizer

    ctu.datetime = _UtcClock
    tok = AutoTokenizer.from_pretrained(harness.model_dir("tiny-qwen2"))

    def render(template: str, case: str) -> tuple[str, str]:
        messages, opts = CASES[case]
        bos, eos = SPECIAL_TOKENS[template]
        source = (TEMPLATES / f"{template}.jinja").read_text(encoding="utf-8")
        try:
            text = tok.apply_chat_template(
                normalise(messages), tools=opts.get("tools"), chat_template=source, tokenize=False,
                add_generation_prompt=opts.get("add_generation_prompt", True),
                continue_final_message=opts.get("continue_final_message", False),
                bos_token=bos, eos_token=eos, **opts.get("kwargs", {}))
        except Exception as e:  # noqa: BLE001 - any failure of the reference is recorded
            if type(e) is jinja2.exceptions.TemplateError:  # raise_exception(message)
                return "raised", str(e)
            return "failed", f"{type(e).__name__}: {e}"
        return "ok", text

    return render


def template_names() -> list[str]:
    return sorted(p.stem for p in TEMPLATES.glob("*.jinja"))


def grpc_chat_input(pb, template: str, case: str):
    """The case as a gRPC ChatInput, in wire form (arguments as JSON text)."""
    from google.protobuf import struct_pb2

    messages, opts = CASES[case]
    bos, eos = SPECIAL_TOKENS[template]
    kwargs = struct_pb2.Struct()
    kwargs.update({"bos_token": bos, "eos_token": eos, **opts.get("kwargs", {})})
    chat = pb.ChatInput(
        add_generation_prompt=opts.get("add_generation_prompt", True),
        continue_final_message=opts.get("continue_final_message", False),
        chat_template_kwargs=kwargs,
        chat_template=(TEMPLATES / f"{template}.jinja").read_text(encoding="utf-8"),
    )
    for m in messages:
        msg = chat.messages.add(role=m["role"])
        if m.get("content") is not None:
            msg.content = m["content"]
        if "tool_call_id" in m:
            msg.tool_call_id = m["tool_call_id"]
        if "reasoning_content" in m:
            msg.reasoning_content = m["reasoning_content"]
        for c in m.get("tool_calls") or []:
            msg.tool_calls.add(id=c["id"], type=c["type"], function=pb.FunctionCall(
                name=c["function"]["name"], arguments=c["function"]["arguments"]))
    for t in opts.get("tools") or []:
        f = t["function"]
        chat.tools.add(type=t["type"], function=pb.FunctionDefinition(
            name=f["name"], description=f["description"], parameters=json.dumps(f["parameters"])))
    return chat


def uses_clock(template: str) -> bool:
    return "strftime_now" in (TEMPLATES / f"{template}.jinja").read_text(encoding="utf-8")


def template_path(template: str) -> Path:
    return TEMPLATES / f"{template}.jinja"
