"""Tool specs and Hermes-style call parsing: valid calls, and each kind of bad call as a message
for the agent."""
import pytest

from dockyard.agent.tools import (SESSION_TOOLS, InvalidCall, Tool, ToolCall, completion_calls, format_call,
                                  parse_call)


def call(body: str) -> str:
  return f"Let me look.\n<tool_call>\n{body}\n</tool_call>"


def test_a_valid_call_parses_with_its_arguments():
  got = parse_call(call('{"name": "edit", "arguments": {"path": "a.py", "old_str": "x", '
                        '"new_str": "y"}}'), SESSION_TOOLS)
  assert got == ToolCall("edit", {"path": "a.py", "old_str": "x", "new_str": "y"})
  assert parse_call(call('{"name": "submit", "arguments": {}}'), SESSION_TOOLS) == ToolCall("submit", {})
  assert parse_call(call('{"name": "submit"}'), SESSION_TOOLS) == ToolCall("submit", {})


def test_no_call_is_none():
  assert parse_call("I am done.", SESSION_TOOLS) is None


@pytest.mark.parametrize("text, message", [
    (call('{"name": "bash", "arguments": {"command": "ls"'), "not valid JSON"),
    (call('["bash"]'), 'a JSON object with a string "name"'),
    (call('{"name": "rm_rf", "arguments": {}}'), "unknown tool 'rm_rf'; the tools are bash, view"),
    (call('{"name": "bash", "arguments": "ls"}'), "must be a JSON object, got str"),
    (call('{"name": "bash", "arguments": {}}'), "'command' is a required property"),
    (call('{"name": "bash", "arguments": {"command": "ls", "cwd": "/"}}'),
     "Additional properties are not allowed ('cwd'"),
    (call('{"name": "view", "arguments": {"path": "a", "start": "1"}}'), "start: '1' is not of type 'integer'"),
    (call('{"name": "bash", "arguments": {"command": "ls"}, "id": 3}'), "unknown keys ['id']"),
    ('<tool_call>{"name": "submit", "arguments": {}}', "not closed"),
])
def test_bad_calls_say_what_is_wrong(text, message):
  got = parse_call(text, SESSION_TOOLS)
  assert isinstance(got, InvalidCall) and message in got.message, got


def test_specs_are_openai_function_specs_and_bad_tools_are_refused():
  spec = SESSION_TOOLS[0].spec()
  assert spec["type"] == "function" and spec["function"]["name"] == "bash"
  assert spec["function"]["parameters"]["required"] == ["command"]
  with pytest.raises(ValueError, match="of type 'object'"):
    Tool("t", "d", {"type": "string"})
  with pytest.raises(ValueError, match="identifier"):
    Tool("no spaces", "d", {"type": "object"})
  with pytest.raises(Exception, match="is not valid under any of the given schemas"):
    Tool("t", "d", {"type": "object", "properties": {"a": {"type": "nonsense"}}})


def test_format_call_is_what_parse_call_reads_and_a_completion_yields_its_calls_in_order():
  ls, sub = ToolCall("bash", {"command": "ls -a 'x y'"}), ToolCall("submit", {})
  assert parse_call(format_call(ls), SESSION_TOOLS) == ls
  text = (f"stray </tool_call> then {format_call(ls)} and <tool_call>{{nope}}</tool_call>"
          f"{format_call(sub)} and <tool_call>{{\"name\": \"bash\"")
  calls = completion_calls(text, SESSION_TOOLS)
  assert calls[0] == ls and calls[2] == sub and len(calls) == 4
  assert isinstance(calls[1], InvalidCall) and "not valid JSON" in calls[1].message
  assert isinstance(calls[3], InvalidCall) and "not closed" in calls[3].message
  assert completion_calls("no calls here", SESSION_TOOLS) == []
