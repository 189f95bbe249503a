r"""Validates SWE task records through the real sandbox: gold patch resolves N/N, no fix 0/N.

  python -m dockyard.data.validate_swe --tasks data/swe/tiny/train.jsonl               # local executor
  python -m dockyard.data.validate_swe --tasks data/swe/train.jsonl --url http://host:9090 --repeats 3

Each repeat submits every task twice through `SandboxClient.run_many`: once with its gold patch and
once without a fix (the wire task is the record's schema keys with `patch` replaced). "Without a
fix" is `NULL_PATCH`, a patch that only adds a text file: the executor refuses an empty patch
before running anything, so an empty patch would prove nothing; this one makes the tests run on
base_commit + test_patch and must not resolve. A task passes when the gold run is resolved every
time and the no-fix run ran its tests and never resolved, and every test's outcome is the one
the record implies (what plain pytest saw when the task was made): all listed tests pass with the
gold patch; without a fix FAIL_TO_PASS fail and PASS_TO_PASS pass. The summary prints the
per-test agreement. A task with an `environment` is graded
in it (built on first use); a build failure is reported as such, not as a failing gold patch.
The repos the tasks name must exist where the sandbox looks (`python -m
dockyard.data.build_swe_tasks --setup_repos`, or `owner__name` clones for imported or mined tasks).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import inspect
import json
import sys
from typing import Any, Sequence

from dockyard.data import swe

NULL_FILE = "dockyard_validate_no_fix.txt"
NULL_PATCH = (f"diff --git a/{NULL_FILE} b/{NULL_FILE}\nnew file mode 100644\n--- /dev/null\n"
              f"+++ b/{NULL_FILE}\n@@ -0,0 +1 @@\n+validate_swe: a patch that fixes nothing\n")


@dataclasses.dataclass
class TaskCheck:
  instance_id: str
  gold_resolved: int = 0
  empty_resolved: int = 0
  runs: int = 0
  reasons: list[str] = dataclasses.field(default_factory=list)   # why gold failed / no-fix passed
  # Per test and run, the sandbox's outcome against what the record says plain pytest saw: every
  # listed test passes with the gold patch; without a fix FAIL_TO_PASS fails, PASS_TO_PASS passes.
  tests_checked: int = 0
  disagreements: list[str] = dataclasses.field(default_factory=list)

  @property
  def ok(self) -> bool:
    return (self.runs > 0 and self.gold_resolved == self.runs and self.empty_resolved == 0
            and not self.disagreements)


def _field(verdict: Any, name: str, default=None):
  if isinstance(verdict, dict):
    return verdict.get(name, default)
  return getattr(verdict, name, default)


async def _maybe_await(x):
  return await x if inspect.isawaitable(x) else x


async def check_tasks(client, tasks: Sequence[swe.SweTask], repeats: int = 3) -> list[TaskCheck]:
  """Runs gold and no-fix patches `repeats` times through `client.run` (all of a repeat at once;
  the client bounds what is in flight). A task the sandbox gives no verdict for (SandboxError:
  deadline, every executor lost) counts as a failed run of that side, with the error as reason."""
  if repeats < 1:
    raise ValueError(f"repeats must be >= 1, got {repeats}")
  checks = [TaskCheck(t.instance_id) for t in tasks]
  for _ in range(repeats):
    wire = [t.sandbox_dict(t.patch) for t in tasks] + [t.sandbox_dict(NULL_PATCH) for t in tasks]
    verdicts = await asyncio.gather(*(_verdict(client, w) for w in wire))
    n = len(tasks)
    for t, c, gold, empty in zip(tasks, checks, verdicts[:n], verdicts[n:]):
      c.runs += 1
      _compare(c, t, _field(gold, "tests_status") or {}, _field(empty, "tests_status") or {})
      if _field(gold, "resolved"):
        c.gold_resolved += 1
      else:
        c.reasons.append(f"gold not resolved: {_field(gold, 'reason', '')}")
      if _field(empty, "resolved"):
        c.empty_resolved += 1
        c.reasons.append("no-fix patch resolved")
      elif not _field(empty, "patch_applied") or _field(empty, "findings"):
        c.empty_resolved += 1   # the tests did not run as they should: not a pass of the check
        c.reasons.append(f"no-fix run inconclusive: {_field(empty, 'reason', '')} "
                         f"{_field(empty, 'findings', [])}")
  return checks


async def _verdict(client, task: dict) -> Any:
  from dockyard.sandbox.client import SandboxError
  try:
    return await client.run(task)
  except SandboxError as e:   # no executor answered in time: a failed run of this side
    return {"resolved": False, "patch_applied": False, "findings": ["no_verdict"],
            "reason": f"no verdict: {type(e).__name__}: {e}"}


def _compare(check: TaskCheck, task: swe.SweTask, gold: dict, no_fix: dict) -> None:
  from dockyard.sandbox.grading import PASSING
  for test in dict.fromkeys(task.FAIL_TO_PASS + task.PASS_TO_PASS):
    check.tests_checked += 2
    if gold.get(test) not in PASSING:
      check.disagreements.append(f"gold: {test} {gold.get(test, 'not run')}")
    want_pass = test not in task.FAIL_TO_PASS
    if (no_fix.get(test) in PASSING) != want_pass:
      check.disagreements.append(f"no fix: {test} {no_fix.get(test, 'not run')}")


async def check_with_sandbox(tasks: Sequence[swe.SweTask], url: str = "", repeats: int = 3,
                             max_in_flight: int = 4, timeout_s: float = 900.0) -> list[TaskCheck]:
  """Starts a local executor unless `url` is given, then runs `check_tasks`."""
  from dockyard.sandbox.client import SandboxClient
  async with contextlib.AsyncExitStack() as stack:
    if not url:
      from dockyard.sandbox.local import local_executor
      cm = local_executor()   # sync or async context manager; either yields the URL
      url = await (stack.enter_async_context(cm) if hasattr(cm, "__aenter__") else _maybe_await(stack.enter_context(cm)))
    # Few in flight: a task's deadline starts when it is sent, so a deep server queue of big
    # suites would time out tasks that only waited.
    client = SandboxClient(url, request_timeout_s=timeout_s, max_in_flight=max_in_flight)
    try:
      return await check_tasks(client, tasks, repeats)
    finally:
      close = getattr(client, "aclose", None) or getattr(client, "close", None)
      if close is not None:
        await _maybe_await(close())


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--tasks", required=True, help="a .jsonl/.json/.parquet task file")
  ap.add_argument("--url", default="", help="a running executor; default: start a local one")
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--limit", type=int, default=None)
  ap.add_argument("--max_in_flight", type=int, default=4, help="tasks sent to the sandbox at once")
  ap.add_argument("--timeout_s", type=float, default=900.0, help="per task, from when it is sent")
  ap.add_argument("--report", default="", help="write per-task results here (JSON)")
  a = ap.parse_args(argv)
  tasks = swe.load_tasks(a.tasks, limit=a.limit)
  checks = asyncio.run(check_with_sandbox(tasks, a.url, a.repeats, a.max_in_flight, a.timeout_s))
  bad = [c for c in checks if not c.ok]
  for c in bad:
    print(f"FAIL {c.instance_id}: gold {c.gold_resolved}/{c.runs}, no fix {c.empty_resolved}/{c.runs}: "
          f"{'; '.join((c.reasons + c.disagreements)[:3])}")
  checked = sum(c.tests_checked for c in checks)
  agree = checked - sum(len(c.disagreements) for c in checks)
  print(f"per-test agreement with the records (plain pytest): {agree}/{checked} outcomes")
  print(f"{len(checks) - len(bad)}/{len(checks)} tasks pass sandbox validation "
        f"(gold {a.repeats}/{a.repeats}, no fix 0/{a.repeats})")
  if a.report:
    with open(a.report, "w") as f:
      json.dump([dict(dataclasses.asdict(c), ok=c.ok) for c in checks], f, indent=1)
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
