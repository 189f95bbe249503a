"""The task record the sandbox grades: SWE-bench's instance schema plus the agent's patch.

`parse_task` turns a JSON dict from the wire into a `Task`, or raises `TaskError` naming the field
that is wrong. FAIL_TO_PASS / PASS_TO_PASS may be lists or SWE-bench's JSON-encoded strings. An
optional `environment` names the venv the tests run in (`dockyard.sandbox.environments`).
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Mapping

from dockyard.sandbox import environments

_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_COMMIT_RE = re.compile(r"^[0-9a-fA-F]{7,64}$")
MAX_NODEID_BYTES = 4096   # PATH_MAX: a longer test path cannot name a file


class TaskError(ValueError):
  """A task that cannot be graded; the message starts with the offending field."""


@dataclasses.dataclass(frozen=True)
class Task:
  instance_id: str
  repo: str                  # "owner/name" -> <repos_dir>/owner__name
  base_commit: str
  patch: str                 # the agent's patch
  test_patch: str
  fail_to_pass: tuple[str, ...]
  pass_to_pass: tuple[str, ...]
  version: str | None = None
  environment: environments.EnvSpec | None = None   # None: the executor's own interpreter

  @property
  def expected_tests(self) -> tuple[str, ...]:
    seen = dict.fromkeys(self.fail_to_pass + self.pass_to_pass)
    return tuple(seen)

  @property
  def test_files(self) -> tuple[str, ...]:
    """The files to hand pytest: the part of each node id before '::', in first-seen order."""
    return tuple(dict.fromkeys(t.split("::", 1)[0] for t in self.expected_tests))


def _test_ids(task: Mapping[str, Any], key: str) -> tuple[str, ...]:
  value = task.get(key, [])
  if isinstance(value, str):
    try:
      value = json.loads(value) if value.strip() else []
    except json.JSONDecodeError as e:
      raise TaskError(f"{key}: not a list nor a JSON-encoded list ({e})") from None
  if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
    raise TaskError(f"{key}: expected a list of pytest node ids (strings)")
  for nodeid in value:
    path = nodeid.split("::", 1)[0]
    shown = repr(nodeid[:80]) + ("..." if len(nodeid) > 80 else "")
    if len(nodeid.encode("utf-8", "surrogatepass")) > MAX_NODEID_BYTES:
      raise TaskError(f"{key}: {shown} is longer than {MAX_NODEID_BYTES} bytes")
    if not nodeid.strip() or not path.endswith(".py"):
      raise TaskError(f"{key}: {shown} is not a pytest node id like 'tests/test_x.py::test_y'")
    parts = path.split("/")
    if path.startswith("/") or ".." in parts:
      raise TaskError(f"{key}: {shown} points outside the repository")
    if path.startswith("-"):
      raise TaskError(f"{key}: {shown} starts with '-' (it would read as a pytest option)")
    if any(len(p.encode("utf-8", "surrogatepass")) > 255 for p in parts) or "\0" in nodeid:
      raise TaskError(f"{key}: {shown} has a path component longer than 255 bytes or a NUL")
  return tuple(value)


def parse_task(task: Any) -> Task:
  """Validates a task dict from the wire; raises TaskError naming the problem."""
  if not isinstance(task, Mapping):
    raise TaskError(f"task: expected a JSON object, got {type(task).__name__}")
  for key in ("instance_id", "repo", "base_commit"):
    if not isinstance(task.get(key), str) or not task.get(key):
      raise TaskError(f"{key}: missing or not a non-empty string")
  for key in ("patch", "test_patch"):
    if key not in task:
      raise TaskError(f"{key}: missing (use '' for none)")
    if not isinstance(task[key], str):
      raise TaskError(f"{key}: expected a string (a unified diff)")
  if not _REPO_RE.match(task["repo"]):
    raise TaskError(f"repo: {task['repo']!r} is not 'owner/name'")
  if not _COMMIT_RE.match(task["base_commit"]):
    raise TaskError(f"base_commit: {task['base_commit']!r} is not a hex commit id")
  f2p, p2p = _test_ids(task, "FAIL_TO_PASS"), _test_ids(task, "PASS_TO_PASS")
  if not f2p and not p2p:
    raise TaskError("FAIL_TO_PASS: no tests to run (FAIL_TO_PASS and PASS_TO_PASS both empty)")
  version = task.get("version")
  env = task.get("environment")
  try:
    spec = None if env is None else environments.parse_spec(env)
  except environments.EnvironmentSpecError as e:
    raise TaskError(str(e)) from None
  return Task(
      instance_id=task["instance_id"], repo=task["repo"], base_commit=task["base_commit"],
      patch=task["patch"], test_patch=task["test_patch"], fail_to_pass=f2p, pass_to_pass=p2p,
      version=None if version is None else str(version), environment=spec)


# --- terminal tasks: a starting directory built from a spec, and a checker run after the episode ---

TERMINAL_KIND = "terminal"
MAX_TERMINAL_FILES = 1000
MAX_TERMINAL_BYTES = 4 << 20


@dataclasses.dataclass(frozen=True)
class TerminalTask:
  """A shell task for an agent session (`"kind": "terminal"`): `files` {relative path: text} make
  the starting directory, `setup` (bash, may be empty) runs in the sandbox before the agent's first
  command, `check` (bash) runs after the episode; its exit status 0 is a pass. The checker is part
  of the host-side record only: it is never written where the agent can see or change it."""
  instance_id: str
  files: tuple[tuple[str, str], ...]
  setup: str
  check: str


def is_terminal(task: Any) -> bool:
  return isinstance(task, Mapping) and task.get("kind") == TERMINAL_KIND


def parse_terminal_task(task: Any) -> TerminalTask:
  """Validates a terminal task record; raises TaskError naming the field that is wrong."""
  if not is_terminal(task):
    raise TaskError(f"kind: expected {TERMINAL_KIND!r}")
  if not isinstance(task.get("instance_id"), str) or not task["instance_id"]:
    raise TaskError("instance_id: missing or not a non-empty string")
  files = task.get("files", {})
  if not isinstance(files, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                               for k, v in files.items()):
    raise TaskError("files: expected an object {relative path: text}")
  if len(files) > MAX_TERMINAL_FILES:
    raise TaskError(f"files: {len(files)} files, more than {MAX_TERMINAL_FILES}")
  if sum(len(v.encode("utf-8", "surrogatepass")) for v in files.values()) > MAX_TERMINAL_BYTES:
    raise TaskError(f"files: more than {MAX_TERMINAL_BYTES} bytes in all")
  for path in files:
    parts = path.split("/")
    if (not path or path.startswith("/") or "\0" in path or
        any(p in ("", ".", "..") for p in parts) or parts[0] == ".git"):
      raise TaskError(f"files: {path[:80]!r} is not a relative path inside the directory "
                      "(no '..', '.', empty parts, leading '/' or top-level .git)")
  for key, required in (("setup", False), ("check", True)):
    value = task.get(key, "")
    if not isinstance(value, str) or "\0" in value or (required and not value.strip()):
      raise TaskError(f"{key}: expected a{' non-empty' if required else ''} bash script (a string "
                      "without NUL bytes)")
  return TerminalTask(instance_id=task["instance_id"], files=tuple(sorted(files.items())),
                      setup=task.get("setup", ""), check=task["check"])
