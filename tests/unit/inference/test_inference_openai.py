"""Tool-call parsing of chat completions: valid blocks become tool_calls, junk stays text."""

from __future__ import annotations

import json

from stacx.rollout.inference.openai_routes import parse_tool_calls


def test_valid_blocks_become_tool_calls() -> None:
    text = (
        'Let me compute.<tool_call>\n{"name": "calc", "arguments": {"expr": "2+3"}}\n'
        '</tool_call><tool_call>{"name": "echo", "arguments": "{\\"x\\": 1}"}</tool_call>'
    )
    content, calls = parse_tool_calls(text)
    assert content == "Let me compute."
    assert [c["function"]["name"] for c in calls] == ["calc", "echo"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"expr": "2+3"}
    assert calls[1]["function"]["arguments"] == '{"x": 1}'
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)


def test_unparseable_blocks_stay_in_the_content() -> None:
    text = '<tool_call>{"name": 3}</tool_call> and <tool_call>not json</tool_call>'
    content, calls = parse_tool_calls(text)
    assert calls == [] and content == text
