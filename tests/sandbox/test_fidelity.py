"""Grading fidelity on what real test suites do: for each small repo made here, the gold patch
scores 1, the empty patch 0, and the verdict's per-test statuses agree with a plain `pytest` run
of the same files outside the sandbox.

Repos: xfail (strict and not, with `raises`, imperative, as a parametrize mark), skipif, call-time
and module-level skips; unittest `subTest` / `expectedFailure` / `skip` beside class-based tests;
parametrized ids with unicode and backslashes; a tests/pytest.ini (it moves pytest's rootdir)
with `filterwarnings = error` and `--strict-markers`, and tests that write .pyc files; a src
layout. Node ids are what `pytest --collect-only` says on the gold tree, as the task builder
does. Skipped tests are never in a real task's lists; a task that lists them anyway gets their
status right and is not resolved (SKIPPED does not pass).
"""
import os
import re
import subprocess
import sys
import textwrap

import pytest

from dockyard.sandbox import synthetic as rf

pytestmark = pytest.mark.asyncio(loop_scope="session")

D = textwrap.dedent
REPOS = {
    "fid/marks": dict(
        base={"lib/__init__.py": "", "lib/core.py": "def double(x):\n  return x + 1\n"},
        gold={"lib/core.py": "def double(x):\n  return x * 2\n"},
        tests={"tests/test_marks.py": D("""\
            import sys
            import pytest
            from lib.core import double

            def test_double():
              assert double(3) == 6

            @pytest.mark.xfail(reason="negative numbers are not supported yet")
            def test_known_bug():
              assert double(-1) == 99

            @pytest.mark.xfail(strict=False, reason="wrong before the fix")
            def test_xpass_after_fix():
              assert double(0) == 0

            @pytest.mark.xfail(strict=True, raises=ZeroDivisionError)
            def test_strict_raises():
              1 / 0

            @pytest.mark.xfail(raises=TypeError, reason="odd input may raise")
            def test_xfail_other_error():
              assert double(50) == 100

            def test_imperative_xfail():
              pytest.xfail("documented limitation")

            @pytest.mark.parametrize("x, want", [
                (2, 4), pytest.param(-2, 99, marks=pytest.mark.xfail(strict=True)), (5, 10)])
            def test_param(x, want):
              assert double(x) == want

            @pytest.mark.skipif(sys.platform != "nonexistent", reason="never here")
            def test_skipif():
              assert False

            def test_runtime_skip():
              pytest.skip("not here either")
            """),
            "tests/test_modskip.py": D("""\
            import pytest
            pytest.skip("python 2 only", allow_module_level=True)

            def test_py2():
              assert False
            """)},
        # test_xfail_other_error: FAILED before the fix (the wrong error), XPASS after; its twin
        # must still be FAILED, not XFAIL.
        f2p=["tests/test_marks.py::test_double", "tests/test_marks.py::test_param[2-4]",
             "tests/test_marks.py::test_param[5-10]", "tests/test_marks.py::test_xfail_other_error"],
        p2p=["tests/test_marks.py::test_known_bug", "tests/test_marks.py::test_xpass_after_fix",
             "tests/test_marks.py::test_strict_raises", "tests/test_marks.py::test_imperative_xfail",
             "tests/test_marks.py::test_param[-2-99]"],
        skipped=["tests/test_marks.py::test_skipif", "tests/test_marks.py::test_runtime_skip"]),
    "fid/unit": dict(
        base={"lib/__init__.py": "", "lib/stats.py": "def clamp(x, lo, hi):\n  return max(lo, x)\n"},
        gold={"lib/stats.py": "def clamp(x, lo, hi):\n  return min(hi, max(lo, x))\n"},
        tests={"tests/__init__.py": "", "tests/test_stats.py": D("""\
            import unittest
            from lib.stats import clamp

            class TestClamp(unittest.TestCase):
              def test_many(self):
                for x, want in [(-5, 0), (5, 5), (50, 10)]:
                  with self.subTest(x=x):
                    self.assertEqual(clamp(x, 0, 10), want)

              def test_low(self):
                for x in (-3, -2):
                  with self.subTest(x=x):
                    self.assertEqual(clamp(x, 0, 10), 0)

              @unittest.skip("windows only")
              def test_windows(self):
                self.fail()

              @unittest.expectedFailure
              def test_known(self):
                self.assertEqual(clamp(1, 5, 2), 99)

            class TestPlain:
              def test_high(self):
                assert clamp(99, 0, 10) == 10

              def test_mid(self):
                assert clamp(3, 0, 10) == 3
            """)},
        f2p=["tests/test_stats.py::TestClamp::test_many", "tests/test_stats.py::TestPlain::test_high"],
        p2p=["tests/test_stats.py::TestClamp::test_low", "tests/test_stats.py::TestClamp::test_known",
             "tests/test_stats.py::TestPlain::test_mid"],
        skipped=["tests/test_stats.py::TestClamp::test_windows"]),
    "fid/ids": dict(
        base={"lib/__init__.py": "", "lib/text.py": "def shout(s):\n  return s\n"},
        gold={"lib/text.py": "def shout(s):\n  return s.upper()\n"},
        tests={"tests/test_text.py": D("""\
            import pytest
            from lib.text import shout

            @pytest.mark.parametrize("s", ["\\u00e9", "a\\\\b", "\\u65e5\\u672c", "tab\\tx", "q'\\""])
            def test_same_length(s):
              assert len(shout(s)) == len(s)

            @pytest.mark.parametrize("s, want", [
                ("\\u00e9", "\\u00c9"), ("a\\\\b", "A\\\\B"), ("stra\\u00dfe", "STRASSE")])
            def test_shout(s, want):
              assert shout(s) == want
            """)},
        f2p=["tests/test_text.py::test_shout"], p2p=["tests/test_text.py::test_same_length"]),
    "fid/rootdir": dict(
        base={"lib/__init__.py": "", "lib/legacy.py": D("""\
            import warnings

            def parse(s):
              warnings.warn("parse() is deprecated", DeprecationWarning)
              return int(s)
            """)},
        gold={"lib/legacy.py": "def parse(s):\n  return int(s)\n"},
        tests={"tests/pytest.ini": "[pytest]\nfilterwarnings =\n    error\nmarkers =\n"
                                   "    slow: slow tests\naddopts = --strict-markers\n",
               "tests/test_legacy.py": D("""\
            import compileall
            import os
            import py_compile
            import pytest
            from lib.legacy import parse

            def test_parse():
              assert parse("3") == 3

            @pytest.mark.slow
            def test_marked():
              assert True

            def test_writes_pyc(tmp_path):
              src = tmp_path / "m.py"
              src.write_text("x = 1\\n")
              py_compile.compile(str(src), cfile=str(tmp_path / "m.pyc"), doraise=True)
              lib = os.path.join(os.path.dirname(__file__), os.pardir, "lib")
              assert compileall.compile_dir(lib, quiet=1, force=True)
            """)},
        f2p=["tests/test_legacy.py::test_parse"],
        p2p=["tests/test_legacy.py::test_marked", "tests/test_legacy.py::test_writes_pyc"]),
    "fid/src": dict(
        base={"src/pkg/__init__.py": "", "src/pkg/m.py": "def inc(x):\n  return x\n"},
        gold={"src/pkg/m.py": "def inc(x):\n  return x + 1\n"},
        tests={"tests/test_m.py": "from pkg.m import inc\n\n\ndef test_inc():\n  assert inc(1) == 2\n"
                                  "\n\ndef test_type():\n  assert isinstance(inc(1), int)\n"},
        f2p=["tests/test_m.py::test_inc"], p2p=["tests/test_m.py::test_type"]),
}


def _write(root, files):
  for rel, text in files.items():
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
      f.write(text)


def _plain_pytest(tree: str, files: list[str], *extra: str) -> subprocess.CompletedProcess:
  src = os.path.join(tree, "src")
  env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHON"))}
  env.update(PYTHONPATH=src if os.path.isdir(src) else tree, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
             PYTHONDONTWRITEBYTECODE="1")
  # --rootdir=. only keeps node ids relative to the repo (tests/pytest.ini would move them).
  return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir=.",
                         *(extra or ("-v", "-rA")), *files], cwd=tree, env=env, capture_output=True,
                        text=True, timeout=120)


_LINE = re.compile(r"^(\S.*?) (PASSED|FAILED|SKIPPED|XFAIL|XPASS|ERROR)\b")
_SUB = re.compile(r"^SUBFAILED\(.*?\) (\S+)")
_WORST = ["PASSED", "XPASS", "XFAIL", "SKIPPED", "ERROR", "FAILED"]


def _plain_statuses(out: str) -> dict[str, str]:
  """Per-test status as plain pytest's -v output says; a failed subtest fails its test."""
  found = {}
  for line in out.splitlines():
    m = _LINE.match(line)
    if m and "::" in m.group(1):
      old = found.get(m.group(1), "PASSED")
      found[m.group(1)] = max(old, m.group(2), key=_WORST.index)
    m = _SUB.match(line)
    if m:
      found[m.group(1)] = "FAILED"
  return found


@pytest.fixture(scope="module")
def fidelity(workspace):
  """Each repo: base commit in the executor's repos dir, a gold tree, its collected ids."""
  out = {}
  for repo, spec in REPOS.items():
    root = os.path.join(workspace["repos"], repo.replace("/", "__"))
    os.makedirs(root)
    _write(root, spec["base"])
    rf._git(root, "init", "-q")
    rf._git(root, "add", "-A")
    rf._git(root, "commit", "-qm", "base")
    base = rf._git(root, "rev-parse", "HEAD")
    gold_tree = os.path.join(workspace["root"], "gold-" + repo.replace("/", "__"))
    _write(gold_tree, {**spec["base"], **spec["gold"], **spec["tests"]})
    files = sorted(p for p in spec["tests"] if os.path.basename(p).startswith("test_"))
    collected = _plain_pytest(gold_tree, files, "--collect-only", "-q").stdout.splitlines()
    ids = [line.strip() for line in collected if "::" in line]

    def expand(prefixes, ids=ids):
      return [i for i in ids if any(i == p or i.startswith(p + "[") for p in prefixes)]
    test_patch = "".join(rf.diff(p, None, t) for p, t in spec["tests"].items())
    gold = "".join(rf.diff(p, spec["base"][p], t) for p, t in spec["gold"].items())
    out[repo] = dict(base=base, gold_tree=gold_tree, files=files, test_patch=test_patch,
                     gold=gold, f2p=expand(spec["f2p"]), p2p=expand(spec["p2p"]),
                     skipped=expand(spec.get("skipped", [])))
    assert out[repo]["f2p"] and len(out[repo]["f2p"]) >= len(spec["f2p"]), (repo, ids)
  return out


def _task(repo, r, patch, **kw):
  return dict(instance_id=f"{repo}-{kw.pop('tag', 'x')}", repo=repo, base_commit=r["base"],
              patch=patch, test_patch=r["test_patch"], FAIL_TO_PASS=kw.get("f2p", r["f2p"]),
              PASS_TO_PASS=kw.get("p2p", r["p2p"]))


@pytest.mark.parametrize("repo", list(REPOS))
async def test_gold_scores_1_empty_0_and_statuses_match_plain_pytest(repo, fidelity, executor):
  r = fidelity[repo]
  gold = await executor.run(_task(repo, r, r["gold"], tag="gold"))
  assert gold["resolved"] and gold["reward"] == 1.0, (gold["reason"], gold["findings"],
                                                       gold["tests_status"], gold["log_tail"])
  empty = await executor.run(_task(repo, r, "", tag="empty"))
  assert not empty["resolved"] and empty["reward"] == 0.0
  plain = _plain_statuses(_plain_pytest(r["gold_tree"], r["files"]).stdout)
  assert gold["tests_status"] == {t: plain[t] for t in gold["tests_status"]}, plain
  # The bug is still there without the fix: the FAIL_TO_PASS tests do fail in the sandbox.
  revert = "".join(rf.diff(p, t, t + "\n# no change\n") for p, t in REPOS[repo]["base"].items()
                   if t)
  unfixed = await executor.run(_task(repo, r, revert, tag="unfixed"))
  assert unfixed["reward"] == 0.0 and not unfixed["resolved"], unfixed["reason"]
  assert all(unfixed["tests_status"][t] in ("FAILED", "ERROR") for t in r["f2p"]), (
      unfixed["tests_status"])


@pytest.mark.parametrize("repo", [r for r in REPOS if REPOS[r].get("skipped")])
async def test_listed_skips_are_graded_skipped_and_not_resolved(repo, fidelity, executor):
  r = fidelity[repo]
  v = await executor.run(_task(repo, r, r["gold"], tag="skips", p2p=r["p2p"] + r["skipped"]))
  assert not v["resolved"] and v["reward"] == 0.0
  assert {t: v["tests_status"][t] for t in r["skipped"]} == {t: "SKIPPED" for t in r["skipped"]}
  plain = _plain_statuses(_plain_pytest(r["gold_tree"], r["files"]).stdout)
  assert all(plain[t] == "SKIPPED" for t in r["skipped"]), plain
  assert v["findings"] == [], v["findings"]   # a skip is a miss, not tampering


async def test_attack_suite_baseline_gold_fix_of_a_repo_with_xfail_tests_scores_1(fidelity, executor):
  # Part of `-k attack`: the defences must not cost a correct fix its reward.
  r = fidelity["fid/marks"]
  v = await executor.run(_task("fid/marks", r, r["gold"], tag="attack-baseline"))
  assert v["resolved"] and v["reward"] == 1.0 and v["findings"] == [], v["reason"]
