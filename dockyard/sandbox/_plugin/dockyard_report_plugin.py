"""pytest plugin the sandbox's launcher loads by file path (under a random module name) and hands
to `pytest.main(plugins=[...])`; nothing finds it by name, so no repository file can stand in.

`configure(report_fd, ask_fd, answer_fd, tail)` is called by the launcher before any repository
code exists on sys.path. Hooks write one JSON line per report to the results pipe (subtest reports
are flagged, so several call reports under one node id are expected, not forged).

Poisoned twins: the executor copied some FAIL_TO_PASS tests, next to themselves in their files,
under random names, and ended both the original and the twin with the same statement, a call to
`tail` (installed here as a builtin). This process is never told which items are twins: when a
body reaches its tail, the tail asks the executor about the running item (one line on the ask
pipe, one byte back on the answer pipe) and raises for a twin; a poisoned item fails whatever
its xfail marks say. A body that failed before its tail never asks, so in the case that matters
(the bug is still there, the original and its twin fail alike) no twin decision ever enters
this process; a body that was skipped or replaced never reaches the poison, so its twin passes.
What a determined attacker still can do is in docs/sandbox-integrity.md.
This file must import nothing from dockyard: inside the sandbox only this directory is mounted.
"""
import builtins
import json
import os

import pytest
from _pytest.skipping import xfailed_key as _xfailed_key

_state = {"fd": -1, "ask": -1, "answer": -1, "item": None, "asked": None}
_write = os.write
_read = os.read
_dumps = json.dumps


class _Poisoned(pytest.fail.Exception):
  """pytest's own failure, without a traceback: rendering one costs ~5 ms per test."""


def configure(fd, ask_fd, answer_fd, tail):
  _state["fd"], _state["ask"], _state["answer"] = int(fd), int(ask_fd), int(answer_fd)
  setattr(builtins, tail, _tail)


def _write_all(fd, data):
  while data:
    data = data[_write(fd, data):]


def _emit(**event):
  fd = _state["fd"]
  if fd < 0:
    return
  try:
    _write_all(fd, (_dumps(event) + "\n").encode())
  except OSError:
    pass  # the test code closed our fd: the results will be missing, which fails the run


def _poison(item):
  """Asks the executor about the running item, once per item (a test that calls another twinned
  test reaches two tails); any failure to get an answer poisons it (a broken channel must not
  turn into passes)."""
  if _state["asked"] is not None and _state["asked"][0] is item:
    return _state["asked"][1]
  name = getattr(item, "originalname", None) or item.name.split("[", 1)[0]
  try:
    _write_all(_state["ask"], (_dumps({"nodeid": item.nodeid, "name": name}) + "\n").encode())
    answer = _read(_state["answer"], 1)
  except OSError:
    answer = b""
  _state["asked"] = (item, answer != b"0")
  return answer != b"0"


def _tail():
  """The last statement of a twinned FAIL_TO_PASS test and of its twin (outside a test item,
  e.g. called at import, there is nothing to poison)."""
  item = _state["item"]
  if item is not None and _poison(item):
    # No xfail mark may turn the poison into XFAIL: pytest's skipping plugin converts a failed
    # call only when this holds an Xfail, and re-reads the marks only when it holds None.
    item.stash[_xfailed_key] = False
    raise _Poisoned("assertion failed", pytrace=False)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
  _state["item"] = item


def pytest_sessionstart(session):
  _emit(event="start", pid=os.getpid())


def pytest_runtest_logreport(report):
  _emit(event="report", nodeid=report.nodeid, when=report.when, outcome=report.outcome,
        wasxfail=hasattr(report, "wasxfail"),
        subtest=type(report).__name__ == "SubtestReport" or hasattr(report, "context"))


def pytest_collectreport(report):
  if report.failed:
    _emit(event="collect_error", nodeid=report.nodeid)


def pytest_sessionfinish(session, exitstatus):
  _emit(event="finish", exitstatus=int(exitstatus))
