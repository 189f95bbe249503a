"""Grading: per-test statuses from the plugin's events, then the SWE-bench rule plus our checks.

SWE-bench: every FAIL_TO_PASS test must pass (PASSED or XFAIL; missing counts as failed) and no
PASS_TO_PASS test may regress. We also require every expected test id present, pytest's exit
status consistent with the results (1: the canary failed), the plugin's session-finish event,
and the canary FAILED; otherwise a finding zeroes the reward.
"""
from __future__ import annotations

import json
from typing import Iterable

PASSING = ("PASSED", "XFAIL")


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
  """{nodeid: status} from report events, and findings (a report rewritten by a hook)."""
  phases: dict[str, dict[str, dict]] = {}
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
    if when in phases.setdefault(nodeid, {}):
      # The plugin reports each phase once: a second report was forged into the pipe.
      findings.append(f"report_duplicate: {nodeid} {when}")
    phases[nodeid][when] = e
    if e.get("raw") is not None and e.get("raw") != e.get("outcome"):
      findings.append(f"report_tampered: {nodeid} {when} {e.get('raw')} -> {e.get('outcome')}")
  out = {}
  for nodeid, ph in phases.items():
    setup, call, teardown = ph.get("setup", {}), ph.get("call", {}), ph.get("teardown", {})
    if call.get("outcome") == "failed":
      status = "FAILED"
    elif setup.get("outcome") == "failed" or teardown.get("outcome") == "failed":
      status = "ERROR"
    elif call.get("outcome") == "passed":
      status = "XPASS" if call.get("wasxfail") else "PASSED"
    elif setup.get("outcome") == "skipped" or call.get("outcome") == "skipped":
      status = "XFAIL" if (setup.get("wasxfail") or call.get("wasxfail")) else "SKIPPED"
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


def grade(tests_status: dict[str, str], fail_to_pass: Iterable[str],
          pass_to_pass: Iterable[str]) -> tuple[bool, float]:
  """(resolved, pass_rate) by the SWE-bench rule; missing tests count as failed."""
  f2p, p2p = list(fail_to_pass), list(pass_to_pass)
  ids = list(dict.fromkeys(f2p + p2p))
  passing = [t for t in ids if tests_status.get(t) in PASSING]
  resolved = bool(ids) and len(passing) == len(ids)
  return resolved, (len(passing) / len(ids) if ids else 0.0)
