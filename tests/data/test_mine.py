"""`python -m dockyard.data.mine`: fix commits of a real git history -> validated SWE tasks.

Every repository is made here with real git and a few real-looking commits; the tests of the
mined commits run for real (direct_runner, pytest, twice per side). `calc` (flat layout) holds a
normal fix, a fix whose tests include flaky and ambiguously parametrized ones, and commits dropped
for a reason (tests only, docs only, no test change, a binary file, a merge); `srcpkg` is a src
layout mined through the command line with `--python` and `--environment`.
"""
import asyncio
import json
import os
import subprocess
import sys
import textwrap

import pytest

from dockyard.data import direct_runner, mine, swe

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env(n: int = 0) -> dict:
  env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
  env.update(GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1", GIT_AUTHOR_NAME="Ada Dev",
             GIT_AUTHOR_EMAIL="ada@example.com", GIT_COMMITTER_NAME="Ada Dev",
             GIT_COMMITTER_EMAIL="ada@example.com")
  if n:
    date = f"2024-03-{n:02d}T12:00:00+00:00"
    env.update(GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
  return env


def git(repo, *args, n=0, input=None) -> str:
  return subprocess.run(["git", "-c", "commit.gpgSign=false", *args], cwd=repo, env=_env(n), input=input,
                        capture_output=True, text=True, check=True).stdout


def git_ok(repo, *args) -> bool:
  return subprocess.run(["git", *args], cwd=repo, env=_env(), capture_output=True).returncode == 0


class Repo:
  def __init__(self, path):
    self.path, self.n = str(path), 0
    os.makedirs(self.path)
    git(self.path, "init", "-q", "-b", "main")

  def commit(self, message: str, files: dict) -> str:
    for rel, text in files.items():
      full = os.path.join(self.path, rel)
      if text is None:
        os.remove(full)
        continue
      os.makedirs(os.path.dirname(full), exist_ok=True)
      with open(full, "wb" if isinstance(text, bytes) else "w") as f:
        f.write(text if isinstance(text, bytes) else textwrap.dedent(text).lstrip("\n"))
    git(self.path, "add", "-A")
    self.n += 1
    git(self.path, "commit", "-q", "-m", message, n=self.n)
    return git(self.path, "rev-parse", "HEAD").strip()


CALC_V1 = '''
def add(a, b):
    return a + b


def sub(a, b):
    return b - a


def mul(a, b):
    return abs(a) * abs(b)
'''
CALC_V2 = CALC_V1.replace("return b - a", "return a - b")
CALC_V3 = CALC_V2.replace("return abs(a) * abs(b)", "return a * b")

TEST_CALC_V1 = '''
from calc import add


def test_add():
    assert add(2, 3) == 5
'''
TEST_CALC_V2 = TEST_CALC_V1.replace("from calc import add", "from calc import add, sub") + '''

def test_sub():
    assert sub(5, 3) == 2


def test_sub_zero():
    assert sub(0, 0) == 0
'''
# The flip is deterministic: each pytest session in a tree reads and bumps a counter file in it, so
# the two runs of one side (they share the tree) see opposite values.
TEST_MUL = '''
import os

import pytest

from calc import mul

_COUNTER = os.path.join(os.path.dirname(__file__), ".session_count")


def _bump():
    n = int(open(_COUNTER).read()) if os.path.exists(_COUNTER) else 0
    with open(_COUNTER, "w") as f:
        f.write(str(n + 1))
    return n % 2 == 0


EVEN_SESSION = _bump()


def test_mul_negative():
    assert mul(-2, 3) == -6


def test_mul_positive():
    assert mul(2, 3) == 6


def test_mul_negative_flaky():
    assert mul(-1, 1) == -1 and EVEN_SESSION


def test_mul_positive_flaky():
    assert mul(2, 2) == 4 and EVEN_SESSION


@pytest.mark.parametrize("word", ["ok", "two words", "caf\\u00e9"])
def test_mul_sign(word):
    assert mul(-len(word), 1) == -len(word)
'''


@pytest.fixture(scope="module")
def calc(tmp_path_factory):
  """The `calc` history, mined once: (repo, shas, tasks by source commit, report, repos_dir)."""
  base = tmp_path_factory.mktemp("calc")
  r = Repo(base / "calc")
  s = {}
  s["initial"] = r.commit("Initial calc module", {"calc.py": CALC_V1, "tests/test_calc.py": TEST_CALC_V1,
                                                  "README.md": "# calc\n"})
  s["fix_sub"] = r.commit("Fix sub() argument order\n\nsub(a, b) returned b - a; it must be a - b.\n",
                          {"calc.py": CALC_V2, "tests/test_calc.py": TEST_CALC_V2})
  s["docs"] = r.commit("Document usage", {"README.md": "# calc\n\n`add`, `sub`, `mul`.\n"})
  s["tests_only"] = r.commit("Test add with negatives", {"tests/test_calc.py": TEST_CALC_V2 + '''

def test_add_negative():
    assert add(-1, -1) == -2
'''})
  s["no_tests"] = r.commit("Tidy add()", {"calc.py": CALC_V2.replace("def add(a, b):", "def add(a, b):  # a + b")})
  calc_v3 = CALC_V3.replace("def add(a, b):", "def add(a, b):  # a + b")
  s["fix_mul"] = r.commit("mul(): keep the sign of negative factors\n\nFixes #7.\n",
                          {"calc.py": calc_v3, "tests/test_mul.py": TEST_MUL})
  s["binary"] = r.commit("Add a logo and a docstring", {
      "calc.py": '"""Tiny calculator."""\n' + calc_v3, "tests/logo.png": b"\x89PNG\r\n\x1a\n\x00\x00\x01\xff" * 8})
  git(r.path, "checkout", "-q", "-b", "feature")
  s["side"] = r.commit("Add div()", {"calc.py": '"""Tiny calculator."""\n' + calc_v3 + "\n\ndef div(a, b):\n    return a / b\n"})
  git(r.path, "checkout", "-q", "main")
  git(r.path, "merge", "-q", "--no-ff", "feature", "-m", "Merge branch 'feature'", n=20)
  s["merge"] = git(r.path, "rev-parse", "HEAD").strip()
  repos_dir = str(base / "repos")
  out = str(base / "out" / "tasks.jsonl")
  tasks, report = mine.mine(mine.Options(repo=r.path, repos_dir=repos_dir, out=out, timeout_s=60))
  by_commit = {t.meta["source_commit"]: t for t in tasks}
  return r, s, by_commit, report, repos_dir, out


def _entry(report, sha):
  (e,) = [e for e in report["commits"] if e["commit"] == sha]
  return e


def test_normal_fix_commit_is_kept_with_its_tests(calc):
  r, s, tasks, report, repos_dir, out = calc
  t = tasks[s["fix_sub"]]
  assert t.instance_id == f"local__calc-{s['fix_sub'][:12]}"
  assert t.repo == "local/calc"
  assert t.FAIL_TO_PASS == ["tests/test_calc.py::test_sub"]
  assert t.PASS_TO_PASS == ["tests/test_calc.py::test_add", "tests/test_calc.py::test_sub_zero"]
  headers = lambda p: [line for line in p.splitlines() if line.startswith("diff --git ")]
  assert headers(t.patch) == ["diff --git a/calc.py b/calc.py"]
  assert headers(t.test_patch) == ["diff --git a/tests/test_calc.py b/tests/test_calc.py"]
  assert t.problem_statement == "Fix sub() argument order\n\nsub(a, b) returned b - a; it must be a - b."
  assert t.created_at == "2024-03-02T12:00:00+00:00"
  assert t.version == "" and t.meta["source_parent"] == s["initial"]
  # The file holds the same records, SWE-bench style (lists, all schema keys at top level).
  with open(out) as f:
    recs = {json.loads(line)["instance_id"]: json.loads(line) for line in f}
  assert set(recs) == {t.instance_id for t in tasks.values()}
  rec = recs[t.instance_id]
  assert rec["FAIL_TO_PASS"] == t.FAIL_TO_PASS and rec["meta"]["source_commit"] == s["fix_sub"]
  assert "environment" not in rec
  assert swe.load_tasks(out)[0].instance_id in recs


def test_dropped_commits_have_reasons(calc):
  r, s, tasks, report, repos_dir, out = calc
  assert set(tasks) == {s["fix_sub"], s["fix_mul"]}
  reasons = {k: _entry(report, s[k])["reason"] for k in ("initial", "docs", "tests_only", "no_tests", "binary",
                                                          "merge")}
  assert reasons == dict(initial="root_commit", docs="docs_only", tests_only="tests_only", no_tests="no_test_change",
                         binary="binary_diff", merge="merge_commit")
  assert s["side"] not in {e["commit"] for e in report["commits"]}     # first-parent history only
  assert report["candidates"] == 8 and report["kept"] == 2
  assert report["dropped"] == dict(binary_diff=1, docs_only=1, merge_commit=1, no_test_change=1, root_commit=1,
                                   tests_only=1)
  with open(out + ".report.json") as f:
    assert json.load(f)["dropped"] == report["dropped"]
  text = mine.summary(report)
  assert "8 candidate commits, 2 kept, 6 dropped" in text and "tests_only 1" in text
  assert f"{s['tests_only'][:12]} Test add with negatives: dropped: tests_only" in text


def test_flaky_and_ambiguous_tests_are_left_out(calc):
  r, s, tasks, report, repos_dir, out = calc
  t = tasks[s["fix_mul"]]
  f = "tests/test_mul.py::"
  assert t.FAIL_TO_PASS == [f + "test_mul_negative", f + "test_mul_sign[ok]"]
  assert t.PASS_TO_PASS == [f + "test_mul_positive"]
  e = _entry(report, s["fix_mul"])
  assert e["flaky"] == [f + "test_mul_negative_flaky", f + "test_mul_positive_flaky"]
  assert e["left_out"] == {f + "test_mul_sign[caf\\xe9]": "param_not_plain",
                           f + "test_mul_sign[two words]": "param_not_plain"}
  assert t.meta["flaky_dropped"] == e["flaky"] and t.meta["left_out"] == e["left_out"]


def test_task_repo_holds_only_base_trees(calc):
  r, s, tasks, report, repos_dir, out = calc
  task_repo = os.path.join(repos_dir, "local__calc")
  assert report["task_repo"] == task_repo
  for sha, t in tasks.items():
    assert git(task_repo, "rev-parse", f"{t.base_commit}^{{tree}}") == git(r.path, "rev-parse", f"{sha}~1^{{tree}}")
    assert git(task_repo, "rev-list", "--parents", "-n1", t.base_commit).split() == [t.base_commit]
    assert git(task_repo, "rev-parse", f"refs/tags/{t.instance_id}").strip() == t.base_commit
  # Nothing after a base: not the fix commits, not the blobs they (or later commits) made.
  fix = s["fix_mul"]
  for rev in (fix, s["merge"], s["side"]):
    assert not git_ok(task_repo, "cat-file", "-e", rev)
  for rev, path in ((fix, "calc.py"), (fix, "tests/test_mul.py"), (s["binary"], "calc.py"), (s["side"], "calc.py")):
    blob = git(r.path, "rev-parse", f"{rev}:{path}").strip()
    assert git_ok(r.path, "cat-file", "-e", blob)
    assert not git_ok(task_repo, "cat-file", "-e", blob), f"{rev[:8]}:{path} leaked into the task repo"
  trees = {git(task_repo, "rev-parse", f"{c}^{{tree}}").strip()
           for c in git(task_repo, "rev-list", "--all").split()}
  assert trees == {git(r.path, "rev-parse", f"{sha}~1^{{tree}}").strip() for sha in tasks}


def test_patches_apply_at_base_commit_and_give_the_fix(calc, tmp_path):
  r, s, tasks, report, repos_dir, out = calc
  task_repo = os.path.join(repos_dir, "local__calc")
  for n, (sha, t) in enumerate(tasks.items()):
    env = dict(_env(), GIT_INDEX_FILE=str(tmp_path / f"index{n}"))
    run = lambda *a, input=None: subprocess.run(["git", *a], cwd=task_repo, env=env, input=input, text=True,
                                                capture_output=True, check=True).stdout
    run("read-tree", t.base_commit)
    run("apply", "--check", "--cached", "-", input=t.patch)
    run("apply", "--check", "--cached", "-", input=t.test_patch)
    run("apply", "--cached", "-", input=t.patch)
    run("apply", "--cached", "-", input=t.test_patch)
    assert run("write-tree").strip() == git(r.path, "rev-parse", f"{sha}^{{tree}}").strip()


def test_sandbox_cache_exports_the_base_commit(calc, tmp_path):
  from dockyard.sandbox import cache
  r, s, tasks, report, repos_dir, out = calc
  t = tasks[s["fix_sub"]]
  tree = asyncio.run(cache.RepoCache(repos_dir, str(tmp_path / "cache")).tree(t.repo, t.base_commit))
  with open(os.path.join(tree, "calc.py")) as f:
    assert "return b - a" in f.read()     # the bug, as at the parent
  assert not os.path.exists(os.path.join(tree, "tests", "test_mul.py"))


SRC_CORE_V1 = '''
def slug(text):
    return text.lower()
'''
SRC_CORE_V2 = '''
def slug(text):
    return "-".join(text.lower().split())
'''
SRC_TEST_V1 = '''
from srcpkg.core import slug


def test_lower():
    assert slug("ABC") == "abc"
'''
SRC_TEST_V2 = SRC_TEST_V1 + '''

def test_spaces():
    assert slug("Hello  World") == "hello-world"
'''


def test_src_layout_through_the_cli(tmp_path, capsys):
  r = Repo(tmp_path / "srcpkg")
  r.commit("Start srcpkg", {"src/srcpkg/__init__.py": "", "src/srcpkg/core.py": SRC_CORE_V1,
                            "tests/test_core.py": SRC_TEST_V1, "pyproject.toml": "[project]\nname = 'srcpkg'\n"})
  fix = r.commit("slug(): join words with dashes", {"src/srcpkg/core.py": SRC_CORE_V2, "tests/test_core.py": SRC_TEST_V2})
  marker = tmp_path / "python_used"
  wrapper = tmp_path / "py.sh"
  wrapper.write_text(f"#!/bin/sh\necho run >> {marker}\nexec {sys.executable} \"$@\"\n")
  wrapper.chmod(0o755)
  environment = {"name": "srcpkg-dev", "python": "3.11", "requirements": ["pytest==9.0.1"]}
  (tmp_path / "env.json").write_text(json.dumps(environment))
  out = tmp_path / "mined.jsonl"
  rc = mine.main(["--repo", r.path, "--name", "acme/srcpkg", "--repos_dir", str(tmp_path / "repos"),
                  "--out", str(out), "--python", str(wrapper), "--environment", str(tmp_path / "env.json")])
  assert rc == 0
  (rec,) = [json.loads(line) for line in out.read_text().splitlines()]
  assert rec["instance_id"] == f"acme__srcpkg-{fix[:12]}"
  assert rec["FAIL_TO_PASS"] == ["tests/test_core.py::test_spaces"]
  assert rec["PASS_TO_PASS"] == ["tests/test_core.py::test_lower"]
  assert rec["environment"] == environment
  assert rec["patch"].startswith("diff --git a/src/srcpkg/core.py b/src/srcpkg/core.py")
  assert marker.read_text().count("run") == 4     # --python ran every test session (2 before, 2 after)
  assert os.path.isdir(tmp_path / "repos" / "acme__srcpkg" / ".git")
  printed = capsys.readouterr().out
  assert "2 candidate commits, 1 kept, 1 dropped (root_commit 1)" in printed
  assert json.loads((tmp_path / "mined.jsonl.report.json").read_text())["kept"] == 1


def test_not_a_git_repository_is_a_clear_error(tmp_path):
  plain = tmp_path / "plain"
  plain.mkdir()
  proc = subprocess.run([sys.executable, "-m", "dockyard.data.mine", "--repo", str(plain), "--out",
                         str(tmp_path / "t.jsonl")], cwd=ROOT, capture_output=True, text=True)
  assert proc.returncode != 0
  assert f"error: --repo {str(plain)!r} is not a git repository" in proc.stderr
  assert "Traceback" not in proc.stderr and not (tmp_path / "t.jsonl").exists()


def test_foreign_task_repo_is_refused(tmp_path):
  r = Repo(tmp_path / "src")
  r.commit("one", {"pkg/a.py": "x = 1\n"})
  other = Repo(tmp_path / "repos" / "local__src")
  other.commit("someone else's history", {"b.py": "y = 2\n"})
  with pytest.raises(mine.MineError, match="was not made by dockyard.data.mine"):
    mine.TaskRepo(str(tmp_path / "repos"), "local/src", r.path)
  with pytest.raises(mine.MineError, match="inside the git repository"):
    mine.open_source(os.path.join(r.path, "pkg"))


def test_classify_and_left_out_rules():
  assert [mine.classify(p) for p in ("pkg/core.py", "tests/helpers.py", "src/test/data.json", "pkg/test_x.py",
                                     "pkg/x_test.py", "conftest.py", "docs/index.md", "testing.py")] == \
      ["source", "test", "test", "test", "test", "test", "other", "source"]
  files = ["tests/test_a.py"]
  reason = lambda t, counts={}: mine.left_out_reason(t, files, counts, {k.split("::")[0] for k, n in counts.items()
                                                                       if n > 1})
  assert reason("tests/test_a.py::test_x[1-2]") is None
  assert reason("tests/test_a.py::TestK::test_x[a_b.c+d]") is None
  assert reason("tests/test_a.py::test_x[]") == "param_not_plain"
  assert reason("tests/test_a.py::test_x[x[1]]") == "param_not_plain"
  assert reason("test_a.py::test_x") == "path_not_relative_to_repo_root"
  assert reason("tests/test_a.py::test_x", {"tests/test_a.py::test_x": 2}) == "collected_twice"
  assert reason("tests/test_a.py::test_y", {"tests/test_a.py::test_x": 2}) == "file_collects_an_id_twice"


def test_duplicate_node_ids_are_left_out():
  run = lambda statuses, collected: direct_runner.TestRun(statuses, {}, {}, set(), collected=collected)
  ids = ["tests/test_a.py::test_dup", "tests/test_a.py::test_dup", "tests/test_a.py::test_ok"]
  before = [run({"tests/test_a.py::test_dup": "failed", "tests/test_a.py::test_ok": "failed"}, ids)] * 2
  after = [run({"tests/test_a.py::test_dup": "passed", "tests/test_a.py::test_ok": "passed"}, ids)] * 2
  res = mine.outcome(before, after, ["tests/test_a.py"])
  assert res.fail_to_pass == [] and res.unlisted_f2p == 2
  assert res.left_out == {"tests/test_a.py::test_dup": "collected_twice",
                          "tests/test_a.py::test_ok": "file_collects_an_id_twice"}
  # Without the duplicate both are FAIL_TO_PASS; a file that failed to collect before counts as an error.
  before = [direct_runner.TestRun({}, {}, {"tests/test_a.py": "ImportError"}, set())] * 2
  res = mine.outcome(before, [run(after[0].statuses, ids[1:])] * 2, ["tests/test_a.py"])
  assert res.fail_to_pass == ["tests/test_a.py::test_dup", "tests/test_a.py::test_ok"]
