"""A pytest plugin loaded (`-p dockyard_outcomes`) into test runs of the task builder's direct runner.

It records one outcome per test node id, folding in setup/teardown errors and pytest 9 subtest
reports (a test whose subtest failed is failed, though its own call report passed), plus the
crash message and traceback locations of failures, and writes them as JSON to
$DOCKYARD_OUTCOMES at the end of the session. Trusted builder code, not a sandbox integrity check.
"""
import json
import os

_results = {}
_collect_errors = {}


def _failure(report):
  longrepr = report.longrepr
  info = {"message": "", "locations": []}
  crash = getattr(longrepr, "reprcrash", None)
  if crash is not None:
    info["message"] = crash.message
  else:
    info["message"] = str(longrepr)[-2000:]
  tb = getattr(longrepr, "reprtraceback", None)
  for entry in getattr(tb, "reprentries", []) or []:
    loc = getattr(entry, "reprfileloc", None)
    if loc is not None:
      info["locations"].append([loc.path, loc.lineno])
  return info


def pytest_runtest_logreport(report):
  rec = _results.setdefault(report.nodeid, {"status": "passed"})
  if hasattr(report, "wasxfail"):
    rec["xfail"] = True
  if report.failed:
    if rec["status"] not in ("failed", "error"):
      rec["status"] = "failed" if report.when == "call" else "error"
      rec.update(_failure(report))
  elif report.skipped and rec["status"] == "passed":
    rec["status"] = "skipped"


def pytest_collectreport(report):
  if report.failed:
    _collect_errors[report.nodeid] = str(report.longrepr)[-2000:]


def pytest_sessionfinish(session, exitstatus):
  path = os.environ.get("DOCKYARD_OUTCOMES")
  if path:
    with open(path, "w") as f:
      json.dump({"tests": _results, "collect_errors": _collect_errors, "exitstatus": int(exitstatus)}, f)
