"""The executor end to end on the synthetic repo: real overlay views, real bubblewrap, real pytest."""
import asyncio
import os

import pytest

from dockyard.sandbox import synthetic as rf
from dockyard.sandbox.isolation import live_sandbox_processes as sandbox_processes
from dockyard.sandbox.executor import Executor
from dockyard.sandbox.task import TaskError

pytestmark = pytest.mark.asyncio(loop_scope="session")

WRONG = rf.CORE_BUGGY.replace("a - b\n\n\ndef sub", "a * b\n\n\ndef sub")   # 2+2 still 4
ZERO = rf.CORE_BUGGY.replace("a - b\n\n\ndef sub", "0\n\n\ndef sub")


async def test_gold_patch_resolves(executor, workspace):
  v = await executor.run(rf.task(workspace["base"], rf.gold_patch()))
  assert v["resolved"] and v["reward"] == 1.0 and v["pass_rate"] == 1.0, v
  assert v["tests_status"] == {"tests/test_calc.py::test_add": "PASSED",
                               "tests/test_new.py::test_new_add": "PASSED",
                               "tests/test_calc.py::test_sub": "PASSED"}
  assert v["apply_method"] == "git apply" and v["findings"] == []
  assert set(v["timings"]) >= {"prepare", "apply", "tests", "total"}
  # A clean patch is applied and tested in one sandbox run: no separate restore run.
  # The log is pytest's: git's lines and the mark that split them off are not in it.
  assert "restore" not in v["timings"] and "Checking patch" not in v["log_head"], v["log_head"]
  assert "must fail" in v["log_head"] and "applied-" not in v["log_head"]
  assert sandbox_processes() == []


async def test_one_run_and_sandbox_path_agree(executor, workspace):
  # The test_patch adds a test in a new directory that writes beside itself (the directory
  # must belong to the sandbox user, as if `git apply` had made it). A patch that also edits a
  # config file's non-pytest part takes the sandbox path (apply run, restore run, test run):
  # the same statuses.
  extra = "import os\n\n\ndef test_writes_beside_itself():\n" \
          "  path = os.path.join(os.path.dirname(__file__), 'out.txt')\n" \
          "  open(path, 'w').write('x')\n  assert open(path).read() == 'x'\n"
  test_patch = rf.test_patch() + rf.diff("tests/extra/test_extra.py", None, extra)
  ids = dict(test_patch=test_patch,
             PASS_TO_PASS=["tests/test_calc.py::test_sub",
                           "tests/extra/test_extra.py::test_writes_beside_itself"])
  one = await executor.run(rf.task(workspace["base"], rf.gold_patch(), **ids))
  old_cfg = "[metadata]\nname = calc\n\n[tool:pytest]\nxfail_strict = true\n"
  cfg = rf.diff("setup.cfg", old_cfg, old_cfg.replace("name = calc", "name = calc2"))
  two = await executor.run(rf.task(workspace["base"], rf.gold_patch() + cfg, **ids))
  assert "restore" not in one["timings"] and "restore" in two["timings"], (one, two)
  assert one["resolved"] and two["resolved"], (one["reason"], two["reason"])
  assert one["tests_status"] == two["tests_status"] and len(one["tests_status"]) == 4


async def test_wrong_patch_fails_by_the_swe_bench_rule(executor, workspace):
  v = await executor.run(rf.task(workspace["base"], rf.src_patch(WRONG)))
  assert not v["resolved"] and v["reward"] == 0.0
  assert v["tests_status"]["tests/test_calc.py::test_add"] == "FAILED"
  assert v["tests_status"]["tests/test_calc.py::test_sub"] == "PASSED"
  assert v["pass_rate"] == pytest.approx(2 / 3)
  assert "test_add" in v["log_tail"], (v["reason"], v["findings"], v["timings"])


async def test_empty_patch_is_a_verdict_not_a_run(executor, workspace):
  v = await executor.run(rf.task(workspace["base"], ""))
  assert v["reason"] == "empty patch" and v["reward"] == 0.0 and not v["patch_applied"]


async def test_patch_that_does_not_apply_is_a_reason(executor, workspace):
  bad = rf.diff("calc/core.py", "def nothing():\n  pass\n", "def nothing():\n  return 1\n")
  v = await executor.run(rf.task(workspace["base"], bad))
  assert not v["patch_applied"] and v["reason"] == "patch does not apply"
  assert "patch --fuzz" in v["log_tail"] and v["reward"] == 0.0
  assert v["log_tail"].index("$ git apply\n") < v["log_tail"].index("$ git apply --3way")


async def test_cascade_falls_back_to_fuzzy_patch(executor, workspace):
  # Context drifted (a changed line next to the hunk): `git apply` refuses, `patch --fuzz` takes it.
  drifted = rf.CORE_BUGGY.replace("def sub(a, b):", "def sub(a, b):  # subtract")
  fixed = rf.CORE_FIXED.replace("def sub(a, b):", "def sub(a, b):  # subtract")
  v = await executor.run(rf.task(workspace["base"], rf.diff("calc/core.py", drifted, fixed)))
  assert v["patch_applied"] and v["apply_method"] in ("git apply --3way", "patch --fuzz"), v
  assert v["resolved"], v


async def test_missing_repo_and_commit_are_reasons(executor, workspace):
  v = await executor.run(rf.task(workspace["base"], rf.gold_patch(), repo="acme/nothere"))
  assert v["reason"].startswith("repo: ") and "no git repository" in v["reason"]
  v = await executor.run(rf.task("deadbeef" * 5, rf.gold_patch()))
  assert "not a commit" in v["reason"] and v["reward"] == 0.0


async def test_malformed_task_raises_naming_the_field(executor):
  with pytest.raises(TaskError, match="^base_commit"):
    await executor.run({"instance_id": "x", "repo": "a/b", "base_commit": "", "patch": "",
                        "test_patch": "", "FAIL_TO_PASS": ["t.py::t"]})


async def test_test_patch_files_the_agent_added_are_replaced(executor, workspace):
  # The agent ships its own tests/test_new.py (always passing) beside the fix: a finding, and
  # the held-out version from test_patch is what runs.
  patch = rf.gold_patch() + rf.diff("tests/test_new.py", None, "def test_new_add():\n  pass\n")
  v = await executor.run(rf.task(workspace["base"], patch))
  assert "touches_test_patch_path: tests/test_new.py" in v["findings"]
  # Graded on the restored tests (all pass), but the finding zeroes it: one truth, not resolved.
  assert v["reward"] == 0.0 and not v["resolved"]
  assert set(v["tests_status"].values()) == {"PASSED"}
  wrong = rf.src_patch(ZERO) + rf.diff("tests/test_new.py", None, "def test_new_add():\n  pass\n")
  v = await executor.run(rf.task(workspace["base"], wrong))
  assert v["tests_status"]["tests/test_new.py::test_new_add"] == "FAILED"


async def test_cache_is_read_only_and_history_free(executor, workspace):
  await executor.run(rf.task(workspace["base"], rf.gold_patch()))
  tree = await executor.cache.tree(rf.REPO, workspace["base"])
  with open(os.path.join(tree, "calc", "core.py")) as f:
    assert f.read() == rf.CORE_BUGGY          # runs never write the cached tree
  import subprocess
  log = subprocess.run(["git", "log", "--all", "--format=%s"], cwd=tree, capture_output=True,
                       text=True).stdout
  assert log.strip().splitlines() == [f"base {workspace['base']}"]
  assert os.stat(executor.cache.cache_dir).st_mode & 0o777 == 0o700


async def test_slots_run_concurrently(workspace):
  ex = Executor(repos_dir=workspace["repos"], cache_dir=workspace["cache"], slots=2)
  tasks = [rf.task(workspace["base"], rf.gold_patch(), instance_id=f"c{i}") for i in range(4)]
  verdicts = await asyncio.gather(*(ex.run(t) for t in tasks))
  assert [v["instance_id"] for v in verdicts] == ["c0", "c1", "c2", "c3"]
  assert all(v["resolved"] for v in verdicts)
  assert ex.running == 0 and sandbox_processes() == []
