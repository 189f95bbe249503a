"""Grading: per-test statuses from the plugin's events, then the SWE-bench rule plus our checks.

Statuses: every report of a node id counts, and the worst wins: a failed call report (a subtest
report too) makes the test FAILED, a failed setup/teardown ERROR; otherwise a passed call is
PASSED (XPASS when pytest marked it xfail and it passed, non-strict; strict xpass is a failed
report), a skip is XFAIL when pytest says it was an expected failure, else SKIPPED. A forged
"passed" report therefore cannot hide a real failure; it can only add to it.

The rule (SWE-bench's harness, `test_passed` / `test_failed`): PASSED and XFAIL pass, FAILED and
ERROR and a missing test fail. Two deliberate differences, both closing reward hacks: SKIPPED
fails (SWE-bench counts a skipped test as neither, so a patch that makes every FAIL_TO_PASS test
skip scores "resolved"; P2P lists hold tests that passed, so a skip is a change the patch made),
and XPASS (a non-strict xfail test that passed; pytest's exit status calls it a success) passes.
Resolved: every FAIL_TO_PASS and PASS_TO_PASS test passes. On top, findings zero the reward: the
canary and every poisoned twin must fail, pytest's exit status must agree, the session must end.
"""
from __future__ import annotations

import json
from typing import Iterable

PASSING = ("PASSED", "XFAIL", "XPASS")


def parse_events(data: bytes) -> list[dict]:
  events = []
  for line in data.splitlines():
    try:
      event = json.loads(line)
    except ValueError:
      continue
    if isinstance(event, dict):
      events.append(event)
  return events


def statuses(events: Iterable[dict]) -> tuple[dict[str, str], list[str]]:
  """{nodeid: status} from report events, and findings (a report forged into the pipe)."""
  phases: dict[str, dict[str, list[dict]]] = {}
  findings = []
  collect_errors = []
  finished = False
  for e in events:
    if finished and e.get("event") in ("report", "finish"):
      findings.append(f"report_after_finish: {e.get('nodeid', 'finish')}")
    finished = finished or e.get("event") == "finish"
    if e.get("event") == "collect_error":
      collect_errors.append(str(e.get("nodeid")))
    if e.get("event") != "report":
      continue
    nodeid, when = str(e.get("nodeid")), str(e.get("when"))
    reports = phases.setdefault(nodeid, {}).setdefault(when, [])
    if not e.get("subtest") and any(not r.get("subtest") for r in reports):
      # pytest reports each phase once (subtests aside): a second one was written by the test code.
      findings.append(f"report_duplicate: {nodeid} {when}")
    reports.append(e)
  out = {}
  for nodeid, ph in phases.items():
    def outcomes(when):
      return {r.get("outcome") for r in ph.get(when, [])}
    def xfail(when):
      return any(r.get("wasxfail") for r in ph.get(when, []))
    if "failed" in outcomes("call"):
      status = "FAILED"
    elif "failed" in outcomes("setup") or "failed" in outcomes("teardown"):
      status = "ERROR"
    elif "skipped" in outcomes("setup") or "skipped" in outcomes("call"):
      status = "XFAIL" if (xfail("setup") or xfail("call")) else "SKIPPED"
    elif "passed" in outcomes("call"):
      status = "XPASS" if xfail("call") else "PASSED"
    else:
      status = "ERROR"
    out[nodeid] = status
  for nodeid in collect_errors:
    out.setdefault(nodeid, "ERROR")
  return out, findings


def expected_statuses(found: dict[str, str], expected: Iterable[str]) -> dict[str, str]:
  """Statuses of the expected ids; a test in a file that failed to collect is ERROR."""
  out = {}
  for nodeid in expected:
    status = found.get(nodeid)
    if status is None:
      path = nodeid.split("::", 1)[0]
      status = "ERROR" if found.get(path) == "ERROR" else "MISSING"
    out[nodeid] = status
  return out


def run_checks(events: list[dict], exit_code: int | None, canary: str,
               found: dict[str, str]) -> list[str]:
  """Findings from the run as a whole: the canary, the exit status, a finished session."""
  findings = []
  finish = [e for e in events if e.get("event") == "finish"]
  if found.get(canary) != "FAILED":
    findings.append(f"canary_not_failed: {found.get(canary, 'MISSING')}")
  if exit_code == 0:
    findings.append("exit_code_inconsistent: pytest exited 0 although the canary must fail")
  if finish and exit_code is not None and finish[-1].get("exitstatus") != exit_code:
    findings.append(f"exit_code_inconsistent: session reported {finish[-1].get('exitstatus')}, "
                    f"process exited {exit_code}")
  return findings


def twin_checks(found: dict[str, str], pairs: Iterable[tuple[str, str]]) -> list[str]:
  """Each poisoned twin must fail wherever its original passed (the plugin makes it fail after
  its body; a passing or skipped twin means something rewrote results, a missing one that
  something hid it)."""
  findings = []
  for original, twin in pairs:
    if found.get(original) in PASSING and found.get(twin) != "FAILED":
      findings.append(f"canary_not_failed: a poisoned twin of {original} is "
                      f"{found.get(twin, 'MISSING')}")
  return findings


def grade(tests_status: dict[str, str], fail_to_pass: Iterable[str],
          pass_to_pass: Iterable[str]) -> tuple[bool, float]:
  """(resolved, pass_rate) by the SWE-bench rule; missing tests count as failed."""
  f2p, p2p = list(fail_to_pass), list(pass_to_pass)
  ids = list(dict.fromkeys(f2p + p2p))
  passing = [t for t in ids if tests_status.get(t) in PASSING]
  resolved = bool(ids) and len(passing) == len(ids)
  return resolved, (len(passing) / len(ids) if ids else 0.0)
