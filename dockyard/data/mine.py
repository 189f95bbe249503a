r"""Mines SWE-bench-format tasks from the history of a local git repository.

  python -m dockyard.data.mine --repo ~/src/mylib --name me/mylib --out tasks.jsonl
  python -m dockyard.data.mine --repo . --rev v2.0 --max_commits 200 --python ~/venvs/mylib/bin/python

Walks the first-parent history of `--rev` (newest first, at most `--max_commits` commits; 0: all)
and keeps fix commits: commits whose diff against their (only) parent changes both Python source
files and test files. A test file is a path under a `tests/` or `test/` directory, a
`test_*.py` / `*_test.py` file, or a `conftest.py`; a source file is any other `.py` file. Merges,
root commits, commits with only tests / only other files (docs, config) / no tests, binary or
submodule changes, and diffs that are not UTF-8 are dropped with a reason. A kept commit's diff
(`git diff --no-renames`) is split into `patch` (every non-test file) and `test_patch` (the test
files). The test modules the test_patch touches (test_*.py / *_test.py that exist after the commit)
are run with `dockyard.data.direct_runner.run_pytest` TWICE on each side, by `--python`, else by the
`--environment`'s venv (built as the sandbox builds it, with its pytest_args), else this Python:
"before" is the parent's tree + test_patch, "after" is that + patch (both through `git apply`, as
the sandbox does); both runs of a side share one tree. A test whose status differs between the two
runs of a side is flaky and never listed. FAIL_TO_PASS: failed/error in both before runs (a test
missing because its file failed to collect, e.g. it imports a name the fix adds, is an error, as
the sandbox's grader counts it) and passed in both after runs; PASS_TO_PASS: passed in all four.
Node ids that a grader could misread are left out and named in the report: a parameter part that
is not plain ASCII (`[A-Za-z0-9_.+-]+`), a path or name part that is not plain, an id collected
twice, any id of a file that collects an id twice (the sandbox counts a second report as forged),
and an id not relative to the repository root (a pytest ini file below it). A commit is kept when
FAIL_TO_PASS is not empty.

Each task's `base_commit` lives in the task repository `<repos_dir>/<owner>__<name>` (where the
sandbox looks): a parentless commit whose tree is the parent commit's tree, tagged with the
instance id; only the objects of those trees are copied in, so nothing after a base commit (the
fix included) can be read from it. Records go to `--out` (SWE-bench JSONL via `swe.write_jsonl`,
`--environment FILE` put verbatim in each as `environment`), a report to `<out>.report.json`.

direct_runner does NOT isolate anything: mine only repositories you trust. Grade the mined tasks
through the sandbox: `python -m dockyard.data.validate_swe --tasks tasks.jsonl`.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Iterable, Mapping, Sequence

from dockyard.data import direct_runner, repos, swe

RUNS = 2                                     # runs per side (before / after)
TEST_DIRS = ("tests", "test")
PLAIN_PARAM = re.compile(r"[A-Za-z0-9_.+-]+")
PLAIN_PATH = re.compile(r"[A-Za-z0-9_./-]+\.py")
PLAIN_NAME = re.compile(r"[A-Za-z0-9_]+")
REPO_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")   # as the sandbox's task.py
FAILING = ("failed", "error")
MARKER_KEY = "dockyard.minedfrom"            # git config key of a task repo this module made
NULL_SHA = "0" * 40


class MineError(RuntimeError):
  """A problem with the inputs (not a git repository, a bad --rev, an existing foreign repo)."""


def log(msg: str) -> None:
  print(f"[{time.strftime('%H:%M:%S')}] mine: {msg}", file=sys.stderr, flush=True)


# --- git --------------------------------------------------------------------------------------


class Git:
  """git on one repository with a config independent of the user's (as `repos.git`), bytes out."""

  def __init__(self, git_dir: str):
    self.git_dir = git_dir

  def run(self, *args: str, input: bytes | None = None, env: Mapping[str, str] | None = None,
          cwd: str | None = None, work_tree: str | None = None) -> bytes:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    full_env.update(repos.GIT_IDENTITY, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull,
                    GIT_TERMINAL_PROMPT="0", **(env or {}))
    cmd = ["git", "-c", "core.autocrlf=false", "-c", "core.fileMode=true", "-c", "diff.noprefix=false",
           "-c", "diff.mnemonicPrefix=false", "-c", "core.quotePath=true", "-c", "commit.gpgSign=false",
           f"--git-dir={self.git_dir}"]
    if work_tree:
      cmd.append(f"--work-tree={work_tree}")
    proc = subprocess.run([*cmd, *args], input=input, capture_output=True, env=full_env,
                          cwd=cwd or self.git_dir)
    if proc.returncode:
      err = proc.stderr.decode("utf-8", "replace").strip()[-2000:]
      raise RuntimeError(f"git {' '.join(args[:4])} failed in {self.git_dir}: {err}")
    return proc.stdout

  def text(self, *args: str, **kw) -> str:
    return self.run(*args, **kw).decode("utf-8", "replace")

  def has(self, obj: str) -> bool:
    try:
      self.run("cat-file", "-e", obj)
      return True
    except RuntimeError:
      return False


def open_source(path: str) -> tuple[Git, str]:
  """(git on the repository at `path`, its top level); MineError when it is not one."""
  if not os.path.isdir(path):
    raise MineError(f"--repo {path!r}: no such directory")
  env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
  env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull)
  proc = subprocess.run(["git", "rev-parse", "--absolute-git-dir", "--is-bare-repository"], cwd=path,
                        capture_output=True, text=True, env=env)
  if proc.returncode:
    raise MineError(f"--repo {path!r} is not a git repository (git: "
                    f"{proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else 'no repository'})")
  git_dir, bare = proc.stdout.split("\n")[:2]
  if bare == "true":
    return Git(git_dir), os.path.abspath(path)
  top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=path, capture_output=True, text=True,
                       env=env).stdout.strip()
  if not top:
    raise MineError(f"--repo {path!r} is the git directory of a repository; pass its work tree")
  if os.path.realpath(top) != os.path.realpath(path):
    raise MineError(f"--repo {path!r} is inside the git repository {top} but is not its top level; "
                    f"pass {top}")
  return Git(git_dir), top


def default_name(top: str) -> str:
  base = os.path.basename(os.path.normpath(top))
  if base.endswith(".git"):
    base = base[:-4]
  base = re.sub(r"[^A-Za-z0-9_.-]+", "-", base).lstrip("-_.") or "repo"
  return f"local/{base}"


# --- one commit: files, diffs -----------------------------------------------------------------


def classify(path: str) -> str:
  """'test' | 'source' | 'other' for a path of the repository."""
  parts = path.split("/")
  base = parts[-1]
  if any(p in TEST_DIRS for p in parts[:-1]) or base == "conftest.py" or is_test_module(path):
    return "test"
  return "source" if base.endswith(".py") else "other"


def is_test_module(path: str) -> bool:
  base = path.rsplit("/", 1)[-1]
  return base.endswith(".py") and (base.startswith("test_") or base.endswith("_test.py"))


@dataclasses.dataclass
class Change:
  path: str
  status: str            # A | M | D | T
  old_mode: str
  new_mode: str
  binary: bool = False


def changes(git: Git, parent: str, commit: str) -> list[Change]:
  """The files `commit` changes against `parent` (no renames), with modes and binary-ness."""
  raw = git.run("diff-tree", "-r", "-z", "--no-renames", "--raw", "--no-commit-id", parent, commit)
  fields = raw.split(b"\0")
  out, i = [], 0
  while i + 1 < len(fields) and fields[i].startswith(b":"):
    old_mode, new_mode, _, _, status = fields[i][1:].decode().split(" ")
    out.append(Change(fields[i + 1].decode("utf-8", "surrogateescape"), status[0], old_mode, new_mode))
    i += 2
  num = git.run("diff-tree", "-r", "-z", "--no-renames", "--numstat", "--no-commit-id", parent, commit)
  binary = set()
  for entry in num.split(b"\0"):
    if entry.startswith(b"-\t-\t"):
      binary.add(entry[4:].decode("utf-8", "surrogateescape"))
  for c in out:
    c.binary = c.path in binary
  return out


def diff(git: Git, parent: str, commit: str, paths: Sequence[str]) -> str:
  """`git diff` of `paths` between the commits, as text `git apply` takes; UnicodeDecodeError if
  it is not UTF-8."""
  if not paths:
    return ""
  out = git.run("--literal-pathspecs", "diff", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames",
                "--full-index", "--binary", parent, commit, "--", *paths)
  return out.decode("utf-8")


def export(git: Git, commit: str, dest: str) -> str:
  """The tree of `commit` at `dest` (every file, as the sandbox's cache exports it), made a fresh
  git repository so `git apply` there patches exactly that tree."""
  os.makedirs(dest)
  with tempfile.TemporaryDirectory() as tmp:
    env = dict(GIT_INDEX_FILE=os.path.join(tmp, "index"))
    git.run("read-tree", commit, env=env)
    git.run("checkout-index", "-a", "-f", env=env, work_tree=dest, cwd=dest)
  init_repo(dest)
  return dest


def init_repo(path: str) -> None:
  env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
  env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull)
  subprocess.run(["git", "init", "-q", "-b", "main", path], check=True, capture_output=True, env=env)


def apply(tree: str, patch: str) -> None:
  if patch:
    Git(os.path.join(tree, ".git")).run("apply", "-", input=patch.encode("utf-8"), cwd=tree, work_tree=tree)


# --- outcomes ---------------------------------------------------------------------------------


def effective(run: direct_runner.TestRun, test: str) -> str:
  """The test's status in `run`; 'error' when it is missing because its file failed to collect."""
  status = run.statuses.get(test)
  if status is None:
    return "error" if test.split("::", 1)[0] in run.collect_errors else "missing"
  return status


def left_out_reason(test: str, run_files: Iterable[str], counts: Mapping[str, int],
                    dup_files: Iterable[str]) -> str | None:
  """Why `test` cannot be listed (None: it can): a node id a grader could misread or that is not
  one test."""
  path, _, rest = test.partition("::")
  if path not in set(run_files):
    return "path_not_relative_to_repo_root"
  if not PLAIN_PATH.fullmatch(path):
    return "path_not_plain"
  if counts.get(test, 0) > 1:
    return "collected_twice"
  if path in set(dup_files):
    return "file_collects_an_id_twice"
  names, bracket, param = rest.partition("[")
  if not all(PLAIN_NAME.fullmatch(n) for n in names.split("::")):
    return "name_not_plain"
  if bracket and not (param.endswith("]") and PLAIN_PARAM.fullmatch(param[:-1])):
    return "param_not_plain"
  return None


@dataclasses.dataclass
class Outcome:
  fail_to_pass: list[str]
  pass_to_pass: list[str]
  flaky: list[str]
  left_out: dict[str, str]       # node id -> reason (would have been listed otherwise)
  unlisted_f2p: int              # F2P candidates left out


def outcome(before: Sequence[direct_runner.TestRun], after: Sequence[direct_runner.TestRun],
            run_files: Sequence[str]) -> Outcome:
  """FAIL_TO_PASS / PASS_TO_PASS from the runs of each side (see the module doc)."""
  ids = sorted(set().union(*(r.statuses for r in (*before, *after))))
  xfail = set().union(*(r.xfail for r in (*before, *after)))
  flaky = sorted(t for t in ids if any(len({effective(r, t) for r in side}) > 1 for side in (before, after)))
  counts: dict[str, int] = {}
  for r in (*before, *after):
    for t, n in collections.Counter(r.collected).items():
      counts[t] = max(counts.get(t, 0), n)
  dup_files = {t.split("::", 1)[0] for t, n in counts.items() if n > 1}
  f2p, p2p, left_out = [], [], {}
  unlisted = 0
  for t in ids:
    if t in xfail or t in flaky:
      continue
    b = [effective(r, t) for r in before]
    a = [effective(r, t) for r in after]
    if all(s in FAILING for s in b) and all(s == "passed" for s in a):
      target = f2p
    elif all(s == "passed" for s in b + a):
      target = p2p
    else:
      continue
    reason = left_out_reason(t, run_files, counts, dup_files)
    if reason:
      left_out[t] = reason
      unlisted += target is f2p
    else:
      target.append(t)
  return Outcome(f2p, p2p, flaky, left_out, unlisted)


# --- the task repository ----------------------------------------------------------------------


class TaskRepo:
  """`<repos_dir>/<owner>__<name>`: one parentless commit per base tree, tagged per task."""

  def __init__(self, repos_dir: str, repo: str, source_top: str):
    self.path = os.path.join(os.path.expanduser(repos_dir), repos.repo_dirname(repo))
    self.repo = repo
    if os.path.realpath(self.path) == os.path.realpath(source_top):
      raise MineError(f"the task repository {self.path} would be the source repository itself")
    if os.path.exists(self.path):
      if not os.path.isdir(os.path.join(self.path, ".git")):
        raise MineError(f"{self.path} exists but is not a git repository; remove it or pick another "
                        "--name / --repos_dir")
      self.git = Git(os.path.join(self.path, ".git"))
      try:
        self.git.text("config", "--get", MARKER_KEY)
      except RuntimeError:
        raise MineError(f"{self.path} exists but was not made by dockyard.data.mine (it may hold history "
                        "past the base commits); remove it or pick another --name / --repos_dir") from None
    else:
      os.makedirs(os.path.dirname(self.path), exist_ok=True)
      init_repo(self.path)
      self.git = Git(os.path.join(self.path, ".git"))
    self.git.run("config", MARKER_KEY, source_top)
    self._copied: list[str] = []     # trees copied in by this process (the next pack excludes them)

  def add_base(self, source: Git, parent: str, instance_id: str) -> str:
    """The task repo's base commit for the source commit `parent` (a parentless commit of the
    same tree; only that tree's objects copied), tagged `instance_id`."""
    tree = source.text("rev-parse", "--verify", f"{parent}^{{tree}}").strip()
    if not self.git.has(tree):
      revs = "".join(f"{t}\n" for t in [tree] + [f"^{t}" for t in self._copied[-20:]])
      pack = source.run("pack-objects", "--revs", "--stdout", "-q", input=revs.encode())
      self.git.run("index-pack", "--stdin", input=pack)
      self._copied.append(tree)
    message = f"{self.repo} at {parent}\n\nThe tree of {parent} alone (dockyard.data.mine base).\n"
    base = self.git.text("commit-tree", tree, "-m", message).strip()
    self.git.run("update-ref", f"refs/tags/{instance_id}", base)
    return base


# --- mining -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Options:
  repo: str
  rev: str = "HEAD"
  max_commits: int = 0
  name: str = ""
  repos_dir: str = ""
  out: str = "tasks.jsonl"
  python: str = sys.executable
  environment: dict[str, Any] | None = None
  timeout_s: float = 120.0
  memory_mb: int = 4096


@dataclasses.dataclass
class Commit:
  sha: str
  parents: list[str]
  date: str
  message: str

  @property
  def subject(self) -> str:
    return self.message.split("\n", 1)[0]


def walk(git: Git, rev: str, max_commits: int) -> list[Commit]:
  try:
    sha = git.text("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").strip()
  except RuntimeError:
    raise MineError(f"--rev {rev!r} is not a commit of the repository") from None
  args = ["log", "--first-parent", "-z", "--format=%H%n%P%n%cI%n%B"]
  if max_commits:
    args.append(f"--max-count={max_commits}")
  out = []
  for rec in git.text(*args, sha, "--").split("\0"):
    if not rec.strip():
      continue
    h, parents, date, message = (rec.lstrip("\n").split("\n", 3) + ["", "", ""])[:4]
    out.append(Commit(h, parents.split(), date, message.strip()))
  return out


class Miner:

  def __init__(self, opts: Options):
    self.opts = opts
    self.source, self.top = open_source(opts.repo)
    self.name = opts.name or default_name(self.top)
    if not REPO_RE.fullmatch(self.name):
      raise MineError(f"--name {self.name!r}: expected 'owner/name' of letters, digits, '_', '.', '-'")
    self.repos_dir = opts.repos_dir or repos.default_repos_dir()
    self.task_repo: TaskRepo | None = None   # made on the first kept commit

  def mine(self) -> tuple[list[swe.SweTask], dict[str, Any]]:
    commits = walk(self.source, self.opts.rev, self.opts.max_commits)
    log(f"{self.top}: {len(commits)} commits on the first-parent history of {self.opts.rev}")
    tasks, entries = [], []
    t_all = time.time()
    for i, c in enumerate(commits, 1):
      t0 = time.time()
      entry = dict(commit=c.sha, subject=c.subject, date=c.date)
      try:
        task = self.evaluate(c, entry)
      except MineError:
        raise
      except Exception as e:      # one odd commit must not end a long mining run
        task = None
        entry.update(status="dropped", reason="error", error=f"{type(e).__name__}: {e}"[:2000])
      entry["seconds"] = round(time.time() - t0, 2)
      if task is not None:
        tasks.append(task)
      entries.append(entry)
      what = (f"KEPT {entry['instance_id']} (FAIL_TO_PASS {len(task.FAIL_TO_PASS)}, PASS_TO_PASS "
              f"{len(task.PASS_TO_PASS)})" if task else f"dropped: {entry['reason']}")
      if entry.get("error"):
        what += f" ({entry['error'][:300]})"
      log(f"[{i}/{len(commits)}] {c.sha[:12]} {c.subject[:60]!r}: {what} ({entry['seconds']:.1f}s, "
          f"kept {len(tasks)})")
    dropped = collections.Counter(e["reason"] for e in entries if e["status"] == "dropped")
    report = dict(
        source=self.top, rev=self.opts.rev, repo=self.name, python=self.opts.python,
        task_repo=self.task_repo.path if self.task_repo else None, out=self.opts.out,
        candidates=len(commits), kept=len(tasks), dropped=dict(sorted(dropped.items())),
        seconds=round(time.time() - t_all, 1), commits=entries)
    return tasks, report

  def _drop(self, entry: dict, reason: str, **details) -> None:
    entry.update(status="dropped", reason=reason, **details)
    return None

  def evaluate(self, c: Commit, entry: dict) -> swe.SweTask | None:
    """The task record for commit `c`, or None (`entry` says why)."""
    if len(c.parents) > 1:
      return self._drop(entry, "merge_commit")
    if not c.parents:
      return self._drop(entry, "root_commit")
    parent = c.parents[0]
    entry["parent"] = parent
    files = changes(self.source, parent, c.sha)
    if not files:
      return self._drop(entry, "empty_diff")
    kinds = {f.path: classify(f.path) for f in files}
    by_kind = {k: sorted(p for p, v in kinds.items() if v == k) for k in ("source", "test", "other")}
    entry["files"] = by_kind
    if not by_kind["source"] and not by_kind["test"]:
      return self._drop(entry, "docs_only")
    if not by_kind["source"]:
      return self._drop(entry, "tests_only" if not by_kind["other"] else "no_python_source_change")
    if not by_kind["test"]:
      return self._drop(entry, "no_test_change")
    if any(f.binary for f in files):
      return self._drop(entry, "binary_diff", binary=sorted(f.path for f in files if f.binary))
    if any("160000" in (f.old_mode, f.new_mode) for f in files):
      return self._drop(entry, "submodule_change")
    try:
      patch = diff(self.source, parent, c.sha, by_kind["source"] + by_kind["other"])
      test_patch = diff(self.source, parent, c.sha, by_kind["test"])
    except UnicodeDecodeError:
      return self._drop(entry, "non_utf8_diff")
    run_files = sorted(f.path for f in files if kinds[f.path] == "test" and f.status != "D"
                       and is_test_module(f.path) and f.new_mode.startswith("100"))
    if not run_files:
      return self._drop(entry, "no_test_module_touched")
    entry["run_files"] = run_files
    with tempfile.TemporaryDirectory(prefix="dockyard_mine_") as tmp:
      before_tree = export(self.source, parent, os.path.join(tmp, "before"))
      after_tree = export(self.source, parent, os.path.join(tmp, "after"))
      try:
        apply(before_tree, test_patch)
      except RuntimeError as e:
        return self._drop(entry, "test_patch_does_not_apply", error=str(e)[-1000:])
      try:
        apply(after_tree, test_patch)
        apply(after_tree, patch)
      except RuntimeError as e:
        return self._drop(entry, "patch_does_not_apply", error=str(e)[-1000:])
      before, after = [], []
      for side, tree, runs in (("before", before_tree, before), ("after", after_tree, after)):
        for _ in range(RUNS):
          r = direct_runner.run_pytest(tree, run_files, self.opts.timeout_s, self.opts.memory_mb,
                                       python=self.opts.python, record_collected=True,
                                       pytest_args=(self.opts.environment or {}).get("pytest_args", ()))
          runs.append(r)
          if r.timed_out:
            return self._drop(entry, f"timeout_{side}", timeout_s=self.opts.timeout_s)
          if "<session>" in r.collect_errors:
            return self._drop(entry, f"pytest_did_not_run_{side}", output_tail=r.output_tail[-1500:])
          if side == "before" and not (any(s in FAILING for s in r.statuses.values())
                                       or any(f in r.collect_errors for f in run_files)):
            # Nothing fails before: no FAIL_TO_PASS possible, the other runs are not needed.
            return self._drop(entry, "no_fail_to_pass", runs=len(before) + len(after),
                              collect_errors={side: sorted(r.collect_errors)})
    res = outcome(before, after, run_files)
    entry.update(flaky=res.flaky, left_out=res.left_out,
                 collect_errors={"before": sorted(set().union(*(r.collect_errors for r in before))),
                                 "after": sorted(set().union(*(r.collect_errors for r in after)))})
    if not res.fail_to_pass:
      reason = "only_unlisted_fail_to_pass" if res.unlisted_f2p else "no_fail_to_pass"
      return self._drop(entry, reason)
    if self.task_repo is None:
      self.task_repo = TaskRepo(self.repos_dir, self.name, self.top)
    instance_id = f"{repos.repo_dirname(self.name)}-{c.sha[:12]}"
    base = self.task_repo.add_base(self.source, parent, instance_id)
    record = dict(
        instance_id=instance_id, repo=self.name, base_commit=base, patch=patch, test_patch=test_patch,
        FAIL_TO_PASS=res.fail_to_pass, PASS_TO_PASS=res.pass_to_pass, problem_statement=c.message,
        created_at=c.date, version="", hints_text="", environment_setup_commit="",
        meta=dict(source_commit=c.sha, source_parent=parent, source_repo=self.top, test_files=run_files,
                  flaky_dropped=res.flaky, left_out=res.left_out, validator=f"direct-{RUNS}x{RUNS}"))
    if self.opts.environment is not None:
      record["environment"] = self.opts.environment
    entry.update(status="kept", reason=None, instance_id=instance_id, base_commit=base,
                 FAIL_TO_PASS=res.fail_to_pass, PASS_TO_PASS=len(res.pass_to_pass))
    return swe.SweTask.from_dict(record, f"commit {c.sha}")


def mine(opts: Options) -> tuple[list[swe.SweTask], dict[str, Any]]:
  """Mines, writes `opts.out` and `<out>.report.json`; returns (tasks, report)."""
  miner = Miner(opts)
  if opts.environment is not None:   # a bad spec fails now, not after hours of test runs
    try:
      swe.SweTask.from_dict(dict(instance_id="x", repo="a/b", base_commit=NULL_SHA, patch="", FAIL_TO_PASS=[],
                                 PASS_TO_PASS=[], environment=opts.environment), "--environment")
    except ValueError as e:
      raise MineError(str(e)) from None
  tasks, report = miner.mine()
  swe.write_jsonl(opts.out, tasks)
  with open(opts.out + ".report.json", "w") as f:
    json.dump(report, f, indent=1, ensure_ascii=False)
  return tasks, report


def summary(report: Mapping[str, Any]) -> str:
  lines = []
  for e in report["commits"]:
    what = (f"kept {e['instance_id']} (FAIL_TO_PASS {len(e['FAIL_TO_PASS'])}, PASS_TO_PASS {e['PASS_TO_PASS']})"
            if e["status"] == "kept" else f"dropped: {e['reason']}")
    extra = []
    if e.get("flaky"):
      extra.append(f"{len(e['flaky'])} flaky")
    if e.get("left_out"):
      extra.append(f"{len(e['left_out'])} ids left out")
    lines.append(f"  {e['commit'][:12]} {e['subject'][:60]}: {what}" + (f" [{', '.join(extra)}]" if extra else ""))
  reasons = ", ".join(f"{k} {v}" for k, v in report["dropped"].items()) or "none"
  lines.append(f"{report['candidates']} candidate commits, {report['kept']} kept, "
               f"{report['candidates'] - report['kept']} dropped ({reasons})")
  if report["kept"]:
    lines.append(f"tasks: {report['out']} (repo {report['repo']} at {report['task_repo']}); report: "
                 f"{report['out']}.report.json")
  return "\n".join(lines)


def _environment_python(environment: dict, cache_dir: str) -> str:
  """The venv the sandbox would build for `environment` (built now under the sandbox's default
  cache, reused by an executor using that cache): mining then runs the tests as grading will."""
  from dockyard.sandbox.cache import DEFAULT_CACHE_DIR
  from dockyard.sandbox.environments import (EnvironmentBuildError, EnvironmentCache,
                                             EnvironmentSpecError, parse_spec)
  try:
    spec = parse_spec(environment)
    root = os.path.abspath(os.path.expanduser(cache_dir or DEFAULT_CACHE_DIR))
    return EnvironmentCache(root).ensure_sync(spec).executable
  except (EnvironmentSpecError, EnvironmentBuildError) as e:
    raise SystemExit(f"error: --environment: {e}") from None


def main(argv: Sequence[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--repo", required=True, help="PATH of the local git repository to mine (its top level)")
  ap.add_argument("--rev", default="HEAD", help="walk the first-parent history of this revision")
  ap.add_argument("--max_commits", type=int, default=0, help="walk at most this many commits (0: all)")
  ap.add_argument("--name", default="", help="the tasks' repo 'owner/name' (default: local/<basename of PATH>)")
  ap.add_argument("--repos_dir", default="", help="where the task repository goes (default: "
                  "$DOCKYARD_REPOS_DIR or ~/.cache/dockyard/repos, where the sandbox looks)")
  ap.add_argument("--out", default="tasks.jsonl", help="the task records (JSONL); the report goes to <out>.report.json")
  ap.add_argument("--python", default="", help="the interpreter that runs the tests (needs pytest); default: "
                  "the --environment's venv (built like the sandbox builds it), else this interpreter")
  ap.add_argument("--environment", default="", help="a JSON file: an object put verbatim in every record "
                  "as `environment` (the sandbox's test venv spec)")
  ap.add_argument("--cache_dir", default="", help="the sandbox cache the --environment venv is built in "
                  "(default: the executor's default, ~/.cache/dockyard/sandbox)")
  ap.add_argument("--timeout_s", type=float, default=120.0, help="per pytest run")
  ap.add_argument("--memory_mb", type=int, default=4096, help="address-space limit of a pytest run")
  a = ap.parse_args(argv)
  if a.max_commits < 0:
    ap.error("--max_commits must be >= 0")
  environment = None
  if a.environment:
    try:
      with open(a.environment) as f:
        environment = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
      raise SystemExit(f"error: --environment {a.environment}: {e}")
    if not isinstance(environment, dict):
      raise SystemExit(f"error: --environment {a.environment}: expected a JSON object")
  if not a.python and environment is not None:
    python = _environment_python(environment, a.cache_dir)
  else:
    a.python = a.python or sys.executable
    python = os.path.abspath(a.python) if os.sep in a.python else (shutil.which(a.python) or a.python)
  if not os.access(python, os.X_OK):
    raise SystemExit(f"error: --python {a.python!r} is not an executable")
  opts = Options(repo=a.repo, rev=a.rev, max_commits=a.max_commits, name=a.name, repos_dir=a.repos_dir,
                 out=a.out, python=python, environment=environment, timeout_s=a.timeout_s, memory_mb=a.memory_mb)
  try:
    _, report = mine(opts)
  except MineError as e:
    raise SystemExit(f"error: {e}")
  print(summary(report))
  return 0


if __name__ == "__main__":
  sys.exit(main())
