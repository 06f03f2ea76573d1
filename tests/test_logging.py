"""Logs that read well where they go: plain text (no ANSI colour codes) when
stderr is a file or pipe, as it is for the servers the tests start, and one
JSON object a line with `--log-format json`."""

from __future__ import annotations

import json

MODEL = "tiny-qwen2"


def test_text_logs_to_a_file_have_no_colour_codes(qwen):
    text = qwen.stderr()
    assert "model ready" in text
    assert "\x1b[" not in text, "ANSI escape codes in a log that is not a terminal"


def test_json_logs_are_one_object_a_line(start_server):
    server = start_server(MODEL, "--log-format", "json")
    lines = [line for line in server.stderr().splitlines() if line.strip()]
    assert lines, "no log lines"
    events = [json.loads(line) for line in lines]
    for e in events:
        assert {"timestamp", "level", "target", "fields"} <= e.keys(), e
    messages = [e["fields"].get("message") for e in events]
    assert "model ready" in messages
    ready = events[messages.index("model ready")]
    assert ready["level"] == "INFO" and ready["fields"]["device"] == "cpu"
