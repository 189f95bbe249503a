"""pytest plugin the sandbox loads with `-p` from a read-only directory outside the work tree.

It writes one JSON line per test phase to a pipe whose write end the executor passed in (the fd
number arrives in DOCKYARD_REPORT_FD and is removed from the environment at import, before any
test code runs), so nothing the tests print, no replaced sys.stdout, and no exit code can forge a
result. An innermost `pytest_runtest_makereport` wrapper keeps the outcome pytest itself made; a
difference from what later reaches `pytest_runtest_logreport` means a hook rewrote the report.
This file must import nothing from dockyard: inside the sandbox only this directory is mounted.
"""
import json
import os

import pytest

_FD = int(os.environ.pop("DOCKYARD_REPORT_FD", "-1"))
_raw = {}


def _emit(**event):
  if _FD < 0:
    return
  data = (json.dumps(event) + "\n").encode()
  try:
    while data:
      data = data[os.write(_FD, data):]
  except OSError:
    pass  # the test code closed our fd: the results will be missing, which fails the run


def pytest_sessionstart(session):
  _emit(event="start", pid=os.getpid())


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_makereport(item, call):
  report = yield
  _raw[(report.nodeid, report.when)] = report.outcome
  return report


def pytest_runtest_logreport(report):
  _emit(event="report", nodeid=report.nodeid, when=report.when, outcome=report.outcome,
        wasxfail=hasattr(report, "wasxfail"),
        raw=_raw.pop((report.nodeid, report.when), None))


def pytest_collectreport(report):
  if report.failed:
    _emit(event="collect_error", nodeid=report.nodeid)


def pytest_sessionfinish(session, exitstatus):
  _emit(event="finish", exitstatus=int(exitstatus))
