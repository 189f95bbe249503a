"""The sandbox validation logic (`check_tasks`), driven by a stand-in client that grades patches.

The stand-in is only the far side of `run_many`; what is tested is the bookkeeping around it: what
gets submitted (schema keys, gold vs the no-fix patch) and how verdicts turn into pass / fail.
"""
import pytest

from dockyard.data import swe, validate_swe

TASK = swe.SweTask(instance_id="o__n-1", repo="o/n", base_commit="a" * 40, patch="GOLD",
                   FAIL_TO_PASS=["t.py::a"], PASS_TO_PASS=["t.py::b"], meta={"package": "n"})


class Client:
  def __init__(self, resolves):
    self.resolves, self.seen = resolves, []

  async def run(self, t):
    self.seen.append(t)
    return {"resolved": self.resolves(t), "reason": "tests failed", "patch_applied": True,
            "findings": [], "tests_status": self.statuses(t)}

  def statuses(self, t):
    fixed = t["patch"] == "GOLD"
    return {"t.py::a": "PASSED" if fixed else "FAILED", "t.py::b": "PASSED"}


async def test_gold_and_empty_submitted_each_repeat():
  client = Client(lambda t: t["patch"] == "GOLD")
  (check,) = await validate_swe.check_tasks(client, [TASK], repeats=3)
  assert check.ok and (check.gold_resolved, check.empty_resolved, check.runs) == (3, 0, 3)
  assert [t["patch"] for t in client.seen] == ["GOLD", validate_swe.NULL_PATCH] * 3
  assert all(set(t) == set(swe.SANDBOX_KEYS) for t in client.seen)   # no builder metadata on the wire


async def test_bad_tasks_are_flagged():
  (check,) = await validate_swe.check_tasks(Client(lambda t: True), [TASK], repeats=2)
  assert not check.ok and check.empty_resolved == 2 and "no-fix patch resolved" in check.reasons
  (check,) = await validate_swe.check_tasks(Client(lambda t: False), [TASK], repeats=1)
  assert not check.ok and check.gold_resolved == 0 and "tests failed" in check.reasons[0]
  with pytest.raises(ValueError, match="repeats must be >= 1"):
    await validate_swe.check_tasks(Client(lambda t: True), [TASK], repeats=0)


async def test_a_no_fix_run_that_did_not_test_is_not_a_pass():
  """The no-fix side passes only when its tests ran: a refused or unapplied patch proves nothing."""
  class Refusing(Client):
    async def run(self, t):
      return {"resolved": t["patch"] == "GOLD", "patch_applied": t["patch"] == "GOLD",
              "findings": [], "reason": "patch does not apply", "tests_status": self.statuses(t)}
  (check,) = await validate_swe.check_tasks(Refusing(None), [TASK], repeats=1)
  assert not check.ok and check.gold_resolved == 1 and "inconclusive" in check.reasons[0]


def test_the_no_fix_patch_applies_and_changes_no_code(tmp_path):
  import subprocess
  subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
  (tmp_path / "m.py").write_text("x = 1\n")
  subprocess.run(["git", "apply", "--check", "-"], cwd=tmp_path, input=validate_swe.NULL_PATCH.encode(),
                 check=True)
  from dockyard.sandbox import integrity
  assert integrity.check_patch(validate_swe.NULL_PATCH, []) == []
  assert [p for p in integrity.patch_paths(validate_swe.NULL_PATCH)] == [validate_swe.NULL_FILE]


async def test_outcomes_that_disagree_with_the_record_fail_the_check():
  """A PASS_TO_PASS test that fails without the fix, or a FAIL_TO_PASS one that passes: the record
  does not describe what the sandbox sees."""
  class Off(Client):
    def statuses(self, t):
      return {"t.py::a": "PASSED", "t.py::b": "PASSED" if t["patch"] == "GOLD" else "ERROR"}
  (check,) = await validate_swe.check_tasks(Off(lambda t: t["patch"] == "GOLD"), [TASK], repeats=1)
  assert not check.ok and check.tests_checked == 4
  assert check.disagreements == ["no fix: t.py::a PASSED", "no fix: t.py::b ERROR"]
  (good,) = await validate_swe.check_tasks(Client(lambda t: t["patch"] == "GOLD"), [TASK], repeats=1)
  assert good.ok and good.disagreements == [] and good.tests_checked == 4


async def test_a_task_without_a_verdict_fails_its_side_and_the_rest_go_on():
  from dockyard.sandbox.client import SandboxError
  class Slow(Client):
    async def run(self, t):
      if t["patch"] == "GOLD":
        raise SandboxError("task 'o__n-1': no verdict within 600.0 s")
      return await super().run(t)
  (check,) = await validate_swe.check_tasks(Slow(lambda t: False), [TASK], repeats=2)
  assert not check.ok and check.gold_resolved == 0 and check.runs == 2
  assert check.reasons[0].startswith("gold not resolved: no verdict: SandboxError: task 'o__n-1'")
