"""A small synthetic git repository for sandbox tests and benchmarks: a buggy `add`, fixed later.

`make_repo(repos_dir)` creates `<repos_dir>/acme__calc` with two commits: the base (bug present,
only `test_sub`) and a later "future" commit holding the fix (which must never be reachable from
inside a run). `task(...)` builds a task dict against the base commit.
"""
from __future__ import annotations

import difflib
import os
import subprocess
import textwrap

REPO = "acme/calc"
CORE_BUGGY = "def add(a, b):\n  return a - b\n\n\ndef sub(a, b):\n  return a - b\n"
CORE_FIXED = CORE_BUGGY.replace("return a - b\n\n\ndef sub", "return a + b\n\n\ndef sub")
TEST_BASE = "from calc.core import sub\n\n\ndef test_sub():\n  assert sub(3, 1) == 2\n"
TEST_NEW = "from calc.core import add\n\n\ndef test_new_add():\n  assert add(2, 2) == 4\n"
FIX_MARKER = "FUTURE_FIX_SECRET_7f3a"


def _git(cwd, *args):
  env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
             GIT_COMMITTER_EMAIL="t@t")
  return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True,
                        text=True).stdout.strip()


def _write(root, rel, text):
  path = os.path.join(root, rel)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    f.write(text)


EVIL_REPO = "acme/evil"
# A base tree that is itself compromised: a conftest hook forcing every report to "passed".
# Only the canary (and our innermost report wrapper) can expose it.
EVIL_CONFTEST = {"conftest.py": textwrap.dedent("""\
    import pytest

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(item, call):
      report = yield
      report.outcome = "passed"
      report.longrepr = None
      return report
    """)}


def make_repo(repos_dir: str, repo: str = REPO, extra: dict | None = None) -> str:
  """Creates the repo (plus `extra` {path: text} files at base); returns base_commit."""
  root = os.path.join(repos_dir, repo.replace("/", "__"))
  os.makedirs(root)
  _git(root, "init", "-q")
  _write(root, "calc/__init__.py", "")
  _write(root, "calc/core.py", CORE_BUGGY)
  _write(root, "tests/__init__.py", "")
  _write(root, "tests/test_calc.py", TEST_BASE)
  _write(root, "setup.cfg", "[metadata]\nname = calc\n\n[tool:pytest]\nxfail_strict = true\n")
  for rel, text in (extra or {}).items():
    _write(root, rel, text)
  _git(root, "add", "-A")
  _git(root, "commit", "-qm", "base")
  base = _git(root, "rev-parse", "HEAD")
  _write(root, "calc/core.py", CORE_FIXED + f"# {FIX_MARKER}\n")
  _git(root, "commit", "-qam", f"fix add {FIX_MARKER}")
  return base


def diff(path: str, old: str | None, new: str | None) -> str:
  """A git-style unified diff of one file (None: the file does not exist on that side)."""
  lines = difflib.unified_diff(
      (old or "").splitlines(keepends=True), (new or "").splitlines(keepends=True),
      "/dev/null" if old is None else f"a/{path}", "/dev/null" if new is None else f"b/{path}")
  head = f"diff --git a/{path} b/{path}\n"
  if old is None:
    head += "new file mode 100644\n"
  elif new is None:
    head += "deleted file mode 100644\n"
  return head + "".join(lines)


def gold_patch() -> str:
  return diff("calc/core.py", CORE_BUGGY, CORE_FIXED)


def test_patch() -> str:
  add_test = TEST_BASE.replace("import sub", "import add, sub") + (
      "\n\ndef test_add():\n  assert add(2, 3) == 5\n")
  return diff("tests/test_calc.py", TEST_BASE, add_test) + diff("tests/test_new.py", None, TEST_NEW)


def task(base: str, patch: str, instance_id: str = "acme__calc-1", repo: str = REPO,
         **extra) -> dict:
  t = dict(instance_id=instance_id, repo=repo, base_commit=base, patch=patch,
           test_patch=test_patch(),
           FAIL_TO_PASS=["tests/test_calc.py::test_add", "tests/test_new.py::test_new_add"],
           PASS_TO_PASS=["tests/test_calc.py::test_sub"])
  t.update(extra)
  return t


def src_patch(new_core: str) -> str:
  """The agent's patch replacing calc/core.py by `new_core`."""
  return diff("calc/core.py", CORE_BUGGY, textwrap.dedent(new_core))
