"""Tools as JSON-schema specs, and the agent's Hermes-style calls to them.

The specs go to the chat template (`tools=` of `apply_chat_template`, see
`dockyard.agent.trajectory.ChatRenderer`); the model answers a turn with

  <tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>

and generation stops at `CALL_END` (a stop string), so a turn holds at most one call.
`parse_call` finds it and checks it against its tool's schema (`jsonschema`). A bad call (not JSON,
not an object, an unknown tool, arguments that violate the schema, an unclosed tag) is an
`InvalidCall` whose message is written for the agent: the episode returns it as the tool's result
and counts it toward the invalid-action penalty.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Mapping, Sequence

import jsonschema

CALL_START = "<tool_call>"
CALL_END = "</tool_call>"


@dataclasses.dataclass(frozen=True)
class Tool:
  """One tool: its name, what it does (the model reads this), its arguments' JSON schema, and
  whether calling it ends the episode (submit)."""
  name: str
  description: str
  parameters: Mapping[str, Any]
  ends_episode: bool = False

  def __post_init__(self):
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.name):
      raise ValueError(f"tool name {self.name!r} must be an identifier")
    if self.parameters.get("type") != "object":
      raise ValueError(f"tool {self.name!r}: parameters must be a JSON schema of type 'object', "
                       f"got {dict(self.parameters)!r}")
    jsonschema.Draft202012Validator.check_schema(self.parameters)

  def spec(self) -> dict:
    """The OpenAI/Hermes function spec that chat templates take in `tools=`."""
    return {"type": "function", "function": {"name": self.name, "description": self.description,
                                             "parameters": dict(self.parameters)}}


@dataclasses.dataclass(frozen=True)
class ToolCall:
  name: str
  arguments: dict


@dataclasses.dataclass(frozen=True)
class InvalidCall:
  """A call that could not be run; `message` goes back to the agent as the tool's result."""
  message: str


def _object(properties: Mapping[str, Any], required: Sequence[str]) -> dict:
  return {"type": "object", "properties": dict(properties), "required": list(required),
          "additionalProperties": False}


# The tools of a sandbox session (dockyard.sandbox.client.AgentSession), as the agent sees them.
SESSION_TOOLS = (
    Tool("bash", "Run a shell command in the repository checkout (/testbed) and see its exit code, "
         "stdout and stderr. Each command starts fresh in /testbed: chain steps with &&.",
         _object({"command": {"type": "string", "minLength": 1},
                  "timeout": {"type": "number", "exclusiveMinimum": 0,
                              "description": "seconds; capped by the episode's command budget"}},
                 ["command"])),
    Tool("view", "Show a file's numbered lines (start..end, 1-based, inclusive) or list a directory.",
         _object({"path": {"type": "string"}, "start": {"type": "integer", "minimum": 1},
                  "end": {"type": "integer", "minimum": 1}}, ["path"])),
    Tool("edit", "Replace old_str, which must occur exactly once in the file, by new_str.",
         _object({"path": {"type": "string"}, "old_str": {"type": "string", "minLength": 1},
                  "new_str": {"type": "string"}}, ["path", "old_str", "new_str"])),
    Tool("create", "Write a new file (parent directories are made); overwrite=true replaces one.",
         _object({"path": {"type": "string"}, "content": {"type": "string"},
                  "overwrite": {"type": "boolean"}}, ["path", "content"])),
    Tool("search", "Find lines matching a pattern (plain text unless regex=true) under path.",
         _object({"pattern": {"type": "string", "minLength": 1}, "path": {"type": "string"},
                  "regex": {"type": "boolean"}, "ignore_case": {"type": "boolean"},
                  "max_results": {"type": "integer", "minimum": 1, "maximum": 1000}},
                 ["pattern"])),
    Tool("submit", "Submit the working tree's changes for grading. This ends the episode.",
         _object({}, []), ends_episode=True),
)


def find_tool(tools: Sequence[Tool], name: str) -> Tool | None:
  return next((t for t in tools if t.name == name), None)


def parse_call(text: str, tools: Sequence[Tool]) -> ToolCall | InvalidCall | None:
  """The turn's tool call, an `InvalidCall` saying what is wrong with it, or None when the turn
  has no `<tool_call>` at all (a final answer)."""
  start = text.find(CALL_START)
  if start < 0:
    return None
  end = text.find(CALL_END, start)
  if end < 0:
    return InvalidCall(f"error: the tool call is not closed: end it with {CALL_END}")
  body = text[start + len(CALL_START):end].strip()
  try:
    call = json.loads(body)
  except json.JSONDecodeError as e:
    return InvalidCall(f"error: the tool call is not valid JSON ({e.msg} at line {e.lineno} "
                       f"column {e.colno}); write {{\"name\": ..., \"arguments\": {{...}}}}")
  if not isinstance(call, dict) or not isinstance(call.get("name"), str):
    return InvalidCall("error: the tool call must be a JSON object with a string \"name\" and an "
                       "object \"arguments\"")
  extra = sorted(set(call) - {"name", "arguments"})
  if extra:
    return InvalidCall(f"error: the tool call has unknown keys {extra}; only \"name\" and "
                       "\"arguments\" are allowed")
  tool = find_tool(tools, call["name"])
  if tool is None:
    return InvalidCall(f"error: unknown tool {call['name']!r}; the tools are "
                       f"{', '.join(t.name for t in tools)}")
  arguments = call.get("arguments", {})
  if not isinstance(arguments, dict):
    return InvalidCall(f"error: the arguments of {tool.name!r} must be a JSON object, got "
                       f"{type(arguments).__name__}")
  problems = sorted(jsonschema.Draft202012Validator(tool.parameters).iter_errors(arguments),
                    key=lambda e: list(e.path))
  if problems:
    where = lambda e: "/".join(str(p) for p in e.path) or "arguments"  # noqa: E731
    return InvalidCall(f"error: bad arguments for {tool.name!r}: "
                       + "; ".join(f"{where(e)}: {e.message}" for e in problems[:5]))
  return ToolCall(tool.name, arguments)


def format_call(call: ToolCall) -> str:
  """A call as the model writes it: the text `parse_call` reads back as `call` (oracle trajectories
  for an SFT warm start, scripted agents in tests)."""
  return f"{CALL_START}\n{json.dumps({'name': call.name, 'arguments': dict(call.arguments)})}\n{CALL_END}"


def completion_calls(text: str, tools: Sequence[Tool]) -> list[ToolCall | InvalidCall]:
  """Every tool call of a text, in order, each as `parse_call` reads it (an unclosed last one is
  an InvalidCall): a single-shot completion that plans several calls."""
  calls = []
  while True:
    call = parse_call(text, tools)
    if call is None:
      return calls
    calls.append(call)
    end = text.find(CALL_END, text.find(CALL_START))
    if end < 0:
      return calls
    text = text[end + len(CALL_END):]
