"""The builder's direct, in-process test runner: pytest on a tree, per-test outcomes back.

Used while synthesizing tasks to find FAIL_TO_PASS / PASS_TO_PASS quickly and to validate
candidates 3x3 before the sandbox exists; it mirrors the sandbox's conventions (PYTHONPATH is
`<tree>/src` if present else `<tree>`, plugin autoload off, `-p no:cacheprovider`, the venv's
Python by default; `python=` names another interpreter) but it does NOT isolate anything: run it
only on trees the builder made itself (or, for `dockyard.data.mine`, repositories the user trusts).
"""
from __future__ import annotations

import dataclasses
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
from typing import Sequence

PLUGIN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_pytest_plugin")


@dataclasses.dataclass
class TestRun:
  statuses: dict[str, str]                  # node id -> passed | failed | error | skipped
  failures: dict[str, dict]                 # node id -> {"message", "locations"}
  collect_errors: dict[str, str]            # file -> error text
  xfail: set[str]                           # node ids marked xfail (never listed in a task)
  timed_out: bool = False
  returncode: int = 0
  output_tail: str = ""
  collected: list[str] = dataclasses.field(default_factory=list)   # record_collected: every item's id

  def passed(self) -> set[str]:
    return {t for t, s in self.statuses.items() if s == "passed"}


def python_path(tree: str) -> str:
  src = os.path.join(tree, "src")
  return src if os.path.isdir(src) else tree


def _limits(memory_mb: int):
  def apply():
    os.setsid()
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
  return apply


def run_pytest(tree: str, test_files: Sequence[str], timeout_s: float = 60.0,
               memory_mb: int = 2048, python: str | None = None,
               record_collected: bool = False, pytest_args: Sequence[str] = ()) -> TestRun:
  """Runs pytest on `test_files` (relative to `tree`) and returns per-test outcomes.

  `python`: the interpreter that runs pytest (default: this one, `sys.executable`); it needs pytest.
  `record_collected`: also fill `TestRun.collected` with every collected item's node id, duplicates
  kept (the `dockyard_collected` plugin), so a node id collected twice can be told apart.
  `pytest_args`: added before the test files (a task environment's, as the sandbox adds them).
  """
  if not test_files:
    raise ValueError("run_pytest: no test files given")
  for f in test_files:
    if not os.path.isfile(os.path.join(tree, f)):
      raise FileNotFoundError(f"run_pytest: test file {f!r} not found under {tree}")
  fd, out_json = tempfile.mkstemp(prefix="dockyard_outcomes_", suffix=".json")
  os.close(fd)
  env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHON", "COV_"))}
  env.update(PYTHONPATH=python_path(tree) + os.pathsep + PLUGIN_DIR, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
             PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0", DOCKYARD_OUTCOMES=out_json)
  extra = []
  collected_json = None
  if record_collected:
    fd, collected_json = tempfile.mkstemp(prefix="dockyard_collected_", suffix=".json")
    os.close(fd)
    env["DOCKYARD_COLLECTED"] = collected_json
    extra = ["-p", "dockyard_collected"]
  cmd = [python or sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "dockyard_outcomes",
         *extra, "-q", "--tb=long", "-W", "ignore::DeprecationWarning", *pytest_args, *test_files]
  proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          preexec_fn=_limits(memory_mb))
  timed_out = False
  try:
    out, _ = proc.communicate(timeout=timeout_s)
  except subprocess.TimeoutExpired:
    timed_out = True
    os.killpg(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate()
  try:
    with open(out_json) as f:
      raw = json.load(f) if os.path.getsize(out_json) else None
  finally:
    os.unlink(out_json)
  collected = []
  if collected_json is not None:
    try:
      with open(collected_json) as f:
        collected = json.load(f) if os.path.getsize(collected_json) else []
    finally:
      os.unlink(collected_json)
  tail = out.decode("utf-8", "replace")[-4000:]
  if raw is None:
    return TestRun({}, {}, {"<session>": tail}, set(), timed_out, proc.returncode, tail, collected)
  statuses, failures, xfail = {}, {}, set()
  for node, rec in raw["tests"].items():
    statuses[node] = rec["status"]
    if rec.get("xfail"):
      xfail.add(node)
    if rec["status"] in ("failed", "error"):
      failures[node] = {"message": rec.get("message", ""), "locations": rec.get("locations", [])}
  return TestRun(statuses, failures, raw["collect_errors"], xfail, timed_out, proc.returncode, tail, collected)


def check_not_shadowed(tree: str, module: str) -> str:
  """Asserts `module` imports from `tree` (not site-packages) under the runner's PYTHONPATH."""
  env = dict(os.environ, PYTHONPATH=python_path(tree), PYTHONDONTWRITEBYTECODE="1")
  out = subprocess.run([sys.executable, "-c", f"import {module}; print({module}.__file__)"], cwd=tree,
                       env=env, capture_output=True, text=True, check=True).stdout.strip()
  if not os.path.realpath(out).startswith(os.path.realpath(tree) + os.sep):
    raise RuntimeError(f"{module} imports from {out}, not from the task tree {tree}: the package "
                       "under test is shadowed")
  return out

