"""pytest plugin the sandbox's launcher loads by file path (under a random module name) and hands
to `pytest.main(plugins=[...])`; nothing finds it by name, so no repository file can stand in.

`configure(fd, twins)` is called by the launcher before any repository code exists on sys.path:
it binds the write end of the results pipe and the set of poisoned twins (function names, secret,
per run). Hooks write one JSON line per report to the pipe (subtest reports are flagged, so
several call reports under one node id are expected, not forged).

Poisoned twins: the executor copied some FAIL_TO_PASS tests, next to themselves in their files,
under random names. Every collected item gets the same wrapper around `runtest` and
`iter_markers`; for a twin the wrapper drops skip/xfail marks and raises after the body,
whatever the body did, so a twin always fails unless something rewrote its result. Code that
forces results cannot tell twins from real tests by name, source or markers (what it still can
is in docs/sandbox-integrity.md).
This file must import nothing from dockyard: inside the sandbox only this directory is mounted.
"""
import json
import os

import pytest

_state = {"fd": -1, "twins": frozenset()}
_write = os.write
_dumps = json.dumps
_SKIP_MARKS = frozenset(("skip", "skipif", "xfail"))


def configure(fd, twins):
  _state["fd"] = int(fd)
  _state["twins"] = frozenset(twins)


def _emit(**event):
  fd = _state["fd"]
  if fd < 0:
    return
  data = (_dumps(event) + "\n").encode()
  try:
    while data:
      data = data[_write(fd, data):]
  except OSError:
    pass  # the test code closed our fd: the results will be missing, which fails the run


def pytest_sessionstart(session):
  _emit(event="start", pid=os.getpid())


def _wrap(item, twin):
  runtest, iter_markers = item.runtest, item.iter_markers

  def run():
    try:
      runtest()
    finally:
      if twin:
        raise AssertionError("assertion failed")  # noqa: B012 - a twin must fail, always

  def markers(name=None):
    for mark in iter_markers(name=name):
      if not (twin and mark.name in _SKIP_MARKS):
        yield mark

  item.runtest, item.iter_markers = run, markers


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
  twins = _state["twins"]
  for item in items:
    name = getattr(item, "originalname", None) or item.name.split("[", 1)[0]
    _wrap(item, name in twins)


def pytest_runtest_logreport(report):
  _emit(event="report", nodeid=report.nodeid, when=report.when, outcome=report.outcome,
        wasxfail=hasattr(report, "wasxfail"),
        subtest=type(report).__name__ == "SubtestReport" or hasattr(report, "context"))


def pytest_collectreport(report):
  if report.failed:
    _emit(event="collect_error", nodeid=report.nodeid)


def pytest_sessionfinish(session, exitstatus):
  _emit(event="finish", exitstatus=int(exitstatus))
