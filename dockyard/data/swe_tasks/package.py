r"""One package's sdist -> validated SWE task records (`PackageBuilder`), SWE-smith style.

Fetch the sdist (pip, sha256-pinned), commit it as the pristine tree of `<repos_dir>/<owner>__<name>`,
run its tests `runs` times (flaky tests are never listed), then for seeded candidates of
`mutate.mutations`: mutate one function, run the test files that mention it, and keep the
candidate as a task when tests that passed now fail. A task's `base_commit` is the buggy tree (a
child commit of the pristine one), `patch` the gold fix (the reverse diff), `test_patch` empty (the
tests already in the tree are the held-out tests; the sandbox restores them). Validation (direct
runner, 3x3): the empty patch fails every FAIL_TO_PASS test and passes every PASS_TO_PASS test in
3 of 3 runs; the gold-patched tree, checked to be identical to the pristine tree, passes all of
them in 3 of 3 runs (the pristine tree's runs on the same test files are made 3 times and shared by
the package's tasks with those test files). Progress goes to stderr (`log`).
"""
from __future__ import annotations

import collections
import glob
import os
import random
import re
import shutil
import sys
import tempfile
import time
from typing import Any

from dockyard.data import direct_runner, mutate, problem, repos
from dockyard.data.swe_tasks.options import Options

SAFE_TEST_ID = re.compile(r"^[A-Za-z0-9_./-]+\.py(::[A-Za-z0-9_]+)+(\[[A-Za-z0-9_.+-]*\])?$")
CREATED_AT = "2025-01-01T00:00:00Z"   # synthetic tasks: the fixed build date, not a real PR's


def log(msg: str) -> None:
  print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def source_files(tree: str, pkg: repos.Package) -> list[str]:
  root = direct_runner.python_path(tree)
  single = os.path.join(root, pkg.module + ".py")
  if os.path.isfile(single):
    files = [single]
  else:
    files = glob.glob(os.path.join(root, pkg.module, "**", "*.py"), recursive=True)
  rel = [os.path.relpath(f, tree) for f in files]
  return sorted(f for f in rel if "/tests/" not in f and not os.path.basename(f).startswith(("test_", "_version")))


def test_files(tree: str, pkg: repos.Package) -> list[str]:
  files = sorted({os.path.relpath(f, tree) for g in pkg.test_globs for f in glob.glob(os.path.join(tree, g))})
  if not files:
    raise RuntimeError(f"{pkg.name}: no test files match {pkg.test_globs}")
  return files


def relevant_test_files(tree: str, files: list[str], function: str) -> list[str]:
  """Test files that mention the function (or its class); all of them when none does."""
  names = {function.split(".")[0]}
  last = function.split(".")[-1]
  if not last.startswith("_") and len(last) > 3:
    names.add(last)
  pat = re.compile(r"\b(" + "|".join(map(re.escape, sorted(names))) + r")\b")
  hits = []
  for f in files:
    with open(os.path.join(tree, f), encoding="utf-8") as fh:
      if pat.search(fh.read()):
        hits.append(f)
  return hits or files


def candidate_order(ms: list[mutate.Mutation], rng: random.Random, limit: int) -> list[mutate.Mutation]:
  """Spreads candidates over functions: one per function in a seeded order, then a second of another kind, ..."""
  by_func = collections.defaultdict(list)
  for m in ms:
    by_func[(m.path, m.function)].append(m)
  funcs = sorted(by_func)
  rng.shuffle(funcs)
  for f in funcs:
    rng.shuffle(by_func[f])
    # Diverse kinds first within a function.
    seen, first, rest = set(), [], []
    for m in by_func[f]:
      (rest if m.kind in seen else first).append(m)
      seen.add(m.kind)
    by_func[f] = first + rest
  out = []
  for depth in range(max((len(v) for v in by_func.values()), default=0)):
    for f in funcs:
      if depth < len(by_func[f]):
        out.append(by_func[f][depth])
        if len(out) >= limit:
          return out
  return out


class PackageBuilder:
  """Makes and validates the candidates of one package."""

  def __init__(self, pkg: repos.Package, opts: Options, work: str):
    self.pkg, self.opts, self.work = pkg, opts, work
    self.repo, self.pristine = repos.ensure_pristine(pkg, opts.repos_dir)
    self.tree = os.path.join(work, "tree")
    shutil.rmtree(self.tree, ignore_errors=True)
    repos.export_tree(self.repo, self.pristine, self.tree)
    direct_runner.check_not_shadowed(self.tree, pkg.module)
    self.tests = test_files(self.tree, pkg)
    self.drops = collections.Counter()
    self.gold_runs: dict[tuple[str, ...], list[direct_runner.TestRun]] = {}
    self.timings: dict[str, float] = {}

  def baseline(self) -> None:
    runs = []
    for i in range(self.opts.runs):
      t = time.time()
      runs.append(direct_runner.run_pytest(self.tree, self.tests, self.opts.timeout_s * 3))
      log(f"{self.pkg.name}: baseline run {i + 1}: {len(runs[-1].passed())} passed, "
          f"{len(runs[-1].statuses) - len(runs[-1].passed())} not, {time.time() - t:.1f}s")
      if runs[-1].collect_errors or runs[-1].timed_out:
        raise RuntimeError(f"{self.pkg.name}: the pristine test suite does not run cleanly: "
                           f"{runs[-1].output_tail[-1500:]}")
    ids = set().union(*(r.statuses for r in runs))
    self.flaky = {t for t in ids if len({r.statuses.get(t) for r in runs}) > 1}
    self.xfail = set().union(*(r.xfail for r in runs))
    self.stable_pass = {t for t in ids if all(r.statuses.get(t) == "passed" for r in runs)} - self.xfail
    if self.flaky:
      log(f"{self.pkg.name}: {len(self.flaky)} flaky tests (never listed): {sorted(self.flaky)[:5]}")

  def _gold(self, files: tuple[str, ...]) -> list[direct_runner.TestRun]:
    if files not in self.gold_runs:
      runs = []
      for _ in range(self.opts.runs):
        t = time.time()
        runs.append(direct_runner.run_pytest(self.tree, files, self.opts.timeout_s))
        self.timings[" ".join(files)] = max(self.timings.get(" ".join(files), 0.0), time.time() - t)
      self.gold_runs[files] = runs
    return self.gold_runs[files]

  def evaluate(self, m: mutate.Mutation) -> dict[str, Any] | None:
    """The task record for mutation `m`, or None (with the reason counted in self.drops)."""
    path = os.path.join(self.tree, m.path)
    with open(path, encoding="utf-8") as f:
      original = f.read()
    buggy_src = m.apply(original)
    files = relevant_test_files(self.tree, self.tests, m.function)
    try:
      with open(path, "w", encoding="utf-8") as f:
        f.write(buggy_src)
      run = direct_runner.run_pytest(self.tree, files, self.opts.timeout_s)
    finally:
      with open(path, "w", encoding="utf-8") as f:
        f.write(original)
    if run.timed_out:
      return self._drop("timeout")
    if run.collect_errors:
      return self._drop("collection_error")
    in_files = lambda t: t.split("::")[0] in files
    broken = {t for t in self.stable_pass if in_files(t) and run.statuses.get(t) != "passed"}
    if not broken:
      return self._drop("no_test_fails")
    f2p = sorted(t for t in broken if SAFE_TEST_ID.match(t))
    if not f2p:
      return self._drop("unsafe_test_ids")
    task_files = tuple(sorted({t.split("::")[0] for t in f2p}))
    if len(task_files) > 2:
      return self._drop("more_than_two_test_files")
    p2p = sorted(t for t in self.stable_pass if t.split("::")[0] in task_files and t not in broken
                 and SAFE_TEST_ID.match(t))
    if not p2p:
      return self._drop("no_pass_to_pass")
    return self._validate(m, buggy_src, f2p, p2p, task_files, run)

  def _validate(self, m, buggy_src, f2p, p2p, task_files, discovery) -> dict[str, Any] | None:
    instance_id = f"{self.pkg.repo_dirname}-{m.key}"
    base = repos.commit_tree_with(self.repo, self.pristine, {m.path: buggy_src}, repos.task_message(instance_id))
    gold = repos.git(self.repo, "diff", "--no-color", "--no-ext-diff", "--no-renames", "--full-index",
                     base, self.pristine)
    changed = repos.git(self.repo, "diff", "--name-only", base, self.pristine).split()
    if changed != [m.path]:
      raise RuntimeError(f"{instance_id}: buggy commit differs from pristine in {changed}, expected [{m.path}]")
    with tempfile.TemporaryDirectory(dir=self.work) as tmp:
      buggy_tree = repos.export_tree(self.repo, base, os.path.join(tmp, "buggy"))
      for _ in range(self.opts.runs):
        r = direct_runner.run_pytest(buggy_tree, task_files, self.opts.timeout_s)
        if r.timed_out or any(r.statuses.get(t) == "passed" for t in f2p):
          return self._drop("empty_patch_passes_or_flaky")
        if any(r.statuses.get(t) != "passed" for t in p2p):
          return self._drop("pass_to_pass_flaky_on_buggy_tree")
      # Gold: apply the patch to a copy of the buggy tree; it must give back the pristine tree exactly.
      gold_tree = repos.export_tree(self.repo, base, os.path.join(tmp, "gold"))
      repos.git(gold_tree, "apply", "-", input=gold)
      with open(os.path.join(gold_tree, m.path), encoding="utf-8") as f:
        patched = f.read()
      with open(os.path.join(self.tree, m.path), encoding="utf-8") as f:
        if patched != f.read():
          return self._drop("gold_patch_does_not_restore")
    for r in self._gold(task_files):
      if any(r.statuses.get(t) != "passed" for t in f2p + p2p):
        return self._drop("gold_patch_fails")
    repos.git(self.repo, "update-ref", f"refs/tags/{instance_id}", base)
    statement = problem.write(self.tree, f2p, discovery.failures, roots=[self.tree, self.work])
    return dict(
        instance_id=instance_id, repo=self.pkg.repo, base_commit=base, patch=gold, test_patch="",
        problem_statement=statement, FAIL_TO_PASS=f2p, PASS_TO_PASS=p2p, version=self.pkg.version,
        created_at=CREATED_AT, hints_text="", environment_setup_commit=self.pristine,
        meta=dict(package=self.pkg.name, split=self.pkg.split, file=m.path, function=m.function,
                  mutation=m.kind, line=m.lineno, func_lines=m.func_lines, test_files=list(task_files),
                  validator="direct-3x3"))

  def _drop(self, reason: str) -> None:
    self.drops[reason] += 1
    return None

  def build(self) -> dict[str, Any]:
    self.baseline()
    ms = []
    for f in source_files(self.tree, self.pkg):
      with open(os.path.join(self.tree, f), encoding="utf-8") as fh:
        ms += mutate.mutations(f, fh.read())
    rng = random.Random(f"{self.opts.seed}:{self.pkg.name}")
    cands = candidate_order(ms, rng, self.opts.max_candidates)
    log(f"{self.pkg.name}: {len(ms)} possible mutations, trying up to {len(cands)}")
    tasks, tried = [], 0
    max_kept = min(self.opts.max_kept, self.pkg.max_kept or self.opts.max_kept)
    for m in cands:
      if len(tasks) >= max_kept:
        break
      tried += 1
      t = time.time()
      rec = self.evaluate(m)
      if rec:
        tasks.append(rec)
      log(f"{self.pkg.name}: [{tried}/{len(cands)}] {m.function} {m.kind} -> "
          f"{'KEPT ' + rec['instance_id'] if rec else 'dropped'} ({time.time() - t:.1f}s, kept {len(tasks)})")
    return dict(package=self.pkg.name, candidates=tried, kept=len(tasks), dropped=dict(sorted(self.drops.items())),
                flaky_tests=sorted(self.flaky), pristine_commit=self.pristine, tasks=tasks,
                test_seconds={k: round(v, 2) for k, v in sorted(self.timings.items())})


