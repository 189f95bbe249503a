"""The tiny subset validated with the builder's direct runner: gold resolves, empty patch fails.

This is the check the CI can always run (no sandbox needed); `test_tiny_through_sandbox.py` runs
the same check through the real sandbox once it exists. One run each here (the builder ran 3x3).
"""
import time

import pytest

from dockyard.data import direct_runner, repos


def _resolved(run, task):
  return all(run.statuses.get(t) == "passed" for t in task.FAIL_TO_PASS + task.PASS_TO_PASS)


def test_tiny_gold_resolves_and_empty_fails(swe_repos, tiny_tasks, tmp_path):
  _, paths = swe_repos
  timings = {}
  for task in tiny_tasks:
    files = task.meta["test_files"]
    buggy = repos.export_tree(paths[task.repo], task.base_commit, str(tmp_path / task.instance_id / "empty"))
    t0 = time.time()
    empty = direct_runner.run_pytest(buggy, files, timeout_s=60)
    timings[task.instance_id] = time.time() - t0
    assert not empty.timed_out
    assert not _resolved(empty, task), f"{task.instance_id}: the empty patch resolves it"
    assert all(empty.statuses.get(t) != "passed" for t in task.FAIL_TO_PASS), task.instance_id
    assert all(empty.statuses.get(t) == "passed" for t in task.PASS_TO_PASS), task.instance_id
    gold = repos.export_tree(paths[task.repo], task.base_commit, str(tmp_path / task.instance_id / "gold"))
    repos.git(gold, "apply", "-", input=task.patch)
    run = direct_runner.run_pytest(gold, files, timeout_s=60)
    assert _resolved(run, task), (task.instance_id, {t: run.statuses.get(t) for t in task.FAIL_TO_PASS})
  print("tiny test-run seconds (empty patch):",
        {k: round(v, 2) for k, v in sorted(timings.items(), key=lambda kv: -kv[1])[:5]},
        f"max {max(timings.values()):.2f}")


def test_runner_reports_missing_files(tmp_path):
  with pytest.raises(FileNotFoundError, match="test file 'tests/test_nope.py' not found"):
    direct_runner.run_pytest(str(tmp_path), ["tests/test_nope.py"])
