"""Unit tests of the parts that need no sandbox: task parsing, static integrity, grading."""
import json
import os
import subprocess
import textwrap

import pytest

from dockyard.sandbox import synthetic as rf
from dockyard.sandbox import grading, integrity
from dockyard.sandbox.isolation import Limits, Output, _drain
from dockyard.sandbox.task import TaskError, parse_task


def test_parse_task_accepts_swe_bench_json_strings():
  t = rf.task("a" * 40, rf.gold_patch())
  t["FAIL_TO_PASS"] = json.dumps(t["FAIL_TO_PASS"])
  parsed = parse_task(t)
  assert parsed.fail_to_pass == ("tests/test_calc.py::test_add", "tests/test_new.py::test_new_add")
  assert parsed.test_files == ("tests/test_calc.py", "tests/test_new.py")


@pytest.mark.parametrize("change, field", [
    (dict(repo="no-slash"), "repo"),
    (dict(base_commit="zzz"), "base_commit"),
    (dict(patch=3), "patch"),
    (dict(FAIL_TO_PASS="[not json"), "FAIL_TO_PASS"),
    (dict(FAIL_TO_PASS=["../x.py::t"]), "FAIL_TO_PASS"),
    (dict(PASS_TO_PASS=["tests/test_calc.py"]), None),
    (dict(FAIL_TO_PASS=[], PASS_TO_PASS=[]), "FAIL_TO_PASS"),
    (dict(instance_id=""), "instance_id"),
])
def test_parse_task_names_the_bad_field(change, field):
  t = rf.task("a" * 40, "")
  t.update(change)
  if field is None:
    assert parse_task(t).pass_to_pass == ("tests/test_calc.py",)
    return
  with pytest.raises(TaskError, match=f"^{field}"):
    parse_task(t)
  with pytest.raises(TaskError, match="^task: expected a JSON object"):
    parse_task([t])


def test_check_patch_passes_a_clean_source_patch():
  assert integrity.check_patch(rf.gold_patch(), ["tests/test_calc.py"]) == []


@pytest.mark.parametrize("patch, code", [
    (rf.diff("tests/test_calc.py", rf.TEST_BASE, rf.TEST_BASE + "\n"), "touches_test_patch_path"),
    (rf.diff("tests/test_other.py", None, "x = 1\n"), "touches_test_file"),
    (rf.diff("conftest.py", None, "x = 1\n"), "touches_conftest"),
    (rf.diff("pytest.ini", None, "[pytest]\naddopts = -x\n"), "touches_pytest_config"),
    (rf.diff("calc/sitecustomize.py", None, "x = 1\n"), "touches_site_hook"),
    (rf.diff("evil.pth", None, "import os\n"), "touches_site_hook"),
    (rf.diff("../escape.py", None, "x = 1\n"), "path_escape"),
    (rf.diff(".git/hooks/post-checkout", None, "x\n"), "path_escape"),
    ("2c\nreturn a + b\n.\n", "ed_style_hunk"),
    ("diff --git a/x.bin b/x.bin\nnew file mode 100644\nGIT binary patch\nliteral 3\nKcmZ?b1\n\n",
     "binary_patch"),
    ("diff --git a/link b/link\nnew file mode 120000\n--- /dev/null\n+++ b/link\n@@ -0,0 +1 @@\n"
     "+/etc/passwd\n\\ No newline at end of file\n", "symlink"),
    ("this is not a diff\n", "unparseable_patch"),
])
def test_check_patch_findings(patch, code):
  findings = integrity.check_patch(patch, ["tests/test_calc.py"])
  assert any(f.startswith(code) for f in findings), findings


def test_config_finding_only_for_pytest_sections():
  base = "[metadata]\nname = calc\n\n[tool:pytest]\nxfail_strict = true\n"
  assert integrity.config_finding("setup.cfg", base, base.replace("calc", "calc2")) is None
  assert integrity.config_finding("setup.cfg", base, base + "addopts = -p no:x\n")
  toml = '[project]\nname = "x"\n'
  assert integrity.config_finding("pyproject.toml", toml, toml + "version = '1'\n") is None
  assert integrity.config_finding("pyproject.toml", toml,
                                  toml + "[tool.pytest.ini_options]\naddopts = '-q'\n")


def _report(nodeid, when, outcome, raw=None, wasxfail=False):
  return dict(event="report", nodeid=nodeid, when=when, outcome=outcome, wasxfail=wasxfail,
              raw=raw or outcome)


def test_statuses_and_swe_bench_rule():
  events = [_report("a", "setup", "passed"), _report("a", "call", "passed"),
            _report("b", "setup", "passed"), _report("b", "call", "failed"),
            _report("c", "setup", "failed"),
            _report("d", "setup", "passed"), _report("d", "call", "skipped", wasxfail=True),
            _report("e", "setup", "skipped"),
            dict(event="collect_error", nodeid="tests/test_broken.py")]
  found, findings = grading.statuses(events)
  assert found == {"a": "PASSED", "b": "FAILED", "c": "ERROR", "d": "XFAIL", "e": "SKIPPED",
                   "tests/test_broken.py": "ERROR"}
  assert findings == []
  status = grading.expected_statuses(found, ["a", "d", "zz", "tests/test_broken.py::t"])
  assert status["zz"] == "MISSING" and status["tests/test_broken.py::t"] == "ERROR"
  assert grading.grade(status, ["a", "d"], []) == (True, 1.0)
  assert grading.grade(status, ["a"], ["zz"]) == (False, 0.5)


def test_duplicated_and_late_reports_are_findings():
  events = [_report("a", "call", "passed"), _report("b", "call", "failed"),
            dict(event="finish", exitstatus=1), _report("b", "call", "passed")]
  found, findings = grading.statuses(events)
  codes = {f.split(":")[0] for f in findings}
  assert codes == {"report_duplicate", "report_after_finish"}
  assert found["b"] == "FAILED"   # a forged "passed" never outweighs a real failure


def test_statuses_follow_pytest_for_xfail_skip_and_subtests():
  events = [
      # xfail at call time: pytest turns the failure into a skip with wasxfail
      _report("xf", "setup", "passed"), _report("xf", "call", "skipped", wasxfail=True),
      # non-strict xpass: passed with wasxfail; strict xpass arrives as failed
      _report("xp", "call", "passed", wasxfail=True), _report("xps", "call", "failed"),
      _report("sk", "call", "skipped"),
      # unittest subTest: several call reports under one id, the test's own call passes last
      dict(_report("sub", "call", "passed"), subtest=True),
      dict(_report("sub", "call", "failed"), subtest=True), _report("sub", "call", "passed"),
      dict(_report("subok", "call", "passed"), subtest=True), _report("subok", "call", "passed"),
  ]
  found, findings = grading.statuses(events)
  assert findings == []
  assert found == {"xf": "XFAIL", "xp": "XPASS", "xps": "FAILED", "sk": "SKIPPED",
                   "sub": "FAILED", "subok": "PASSED"}
  # SWE-bench: PASSED and XFAIL pass; we also pass XPASS and fail SKIPPED (a skip resolves nothing)
  assert grading.grade(found, ["xf", "xp", "subok"], []) == (True, 1.0)
  assert grading.grade(found, ["sk"], [])[0] is False
  assert grading.grade(found, ["xf"], ["sk"])[0] is False


def test_twin_checks_want_a_failed_twin_where_the_original_passed():
  pairs = [("t.py::a", "t.py::tw_a"), ("t.py::b", "t.py::tw_b")]
  assert grading.twin_checks({"t.py::a": "PASSED", "t.py::tw_a": "FAILED",
                              "t.py::b": "FAILED", "t.py::tw_b": "PASSED"}, pairs) == []
  bad = grading.twin_checks({"t.py::a": "PASSED", "t.py::tw_a": "PASSED",
                             "t.py::b": "XFAIL"}, pairs)
  assert len(bad) == 2 and all(f.startswith("canary_not_failed") for f in bad)


def test_run_checks_need_a_failed_canary_and_consistent_exit():
  found = {"canary": "PASSED"}
  findings = grading.run_checks([dict(event="finish", exitstatus=0)], 0, "canary", found)
  assert any(f.startswith("canary_not_failed") for f in findings)
  assert any(f.startswith("exit_code_inconsistent") for f in findings)
  assert grading.run_checks([dict(event="finish", exitstatus=1)], 1, "canary",
                            {"canary": "FAILED"}) == []


def test_limits_reject_bad_values():
  with pytest.raises(ValueError, match="Limits.timeout_s"):
    Limits(timeout_s=0)
  with pytest.raises(ValueError, match="Limits.memory_mb"):
    Limits(memory_mb="big")


async def test_drain_keeps_head_and_tail_bounded():
  import asyncio
  reader = asyncio.StreamReader()
  reader.feed_data(b"H" * 1000 + b"x" * 5_000_000 + b"T" * 1000)
  reader.feed_eof()
  out = await _drain(reader, 4000)
  assert out.head == b"H" * 1000 + b"x" * 1000
  assert out.tail == b"x" * 1000 + b"T" * 1000
  assert out.total_bytes == 5_002_000 and out.truncated
  assert isinstance(out, Output) and "bytes cut" in out.text()


def test_client_from_config_uses_env_code():
  from configs import swe
  from dockyard.sandbox.client import SandboxClient
  config = swe.get_config("full")
  client = SandboxClient.from_config(config)
  assert client.urls == ["http://localhost:9090"] and client.request_timeout_s == 600.0
  with pytest.raises(ValueError, match="urls"):
    SandboxClient.from_config(swe.get_config("tiny"))   # tiny has no URLs: the local fleet's
  assert SandboxClient.from_config(swe.get_config("tiny"), urls=["http://h:1"]).urls == ["http://h:1"]


@pytest.mark.parametrize("name, before, after", [
    # configparser reads these headers as sections named "tool:pytest] ;" / "pytest] ;";
    # pytest's own parser (iniconfig) reads them as the pytest section.
    ("setup.cfg", "[metadata]\nname = calc\n", "[metadata]\nname = calc\n\n[tool:pytest] ;]\n"
     "addopts = -p no:x\n"),
    ("tox.ini", None, "[pytest] ;]\naddopts = -x\n"),
    ("tests/tox.ini", None, "[pytest]\naddopts = -x\n"),
])
def test_config_finding_reads_config_as_pytest_does(name, before, after):
  assert integrity.config_finding(name, before, after) == f"touches_pytest_config: {name}"


@pytest.mark.parametrize("path, hook", [
    ("sitecustomize.py", True), ("sitecustomize/__init__.py", True),
    ("pkg/usercustomize/x.py", True), ("src/sitecustomize.pyc", True), ("any/where/x.pth", True),
    ("calc/site_utils.py", False), ("calc/customize.py", False), ("docs/pth.txt", False),
])
def test_site_hooks_by_module_name_in_any_form(path, hook):
  assert integrity.is_site_hook(path) is hook
  if hook:
    assert integrity.check_patch(rf.diff(path, None, "import os\n")) == [
        f"touches_site_hook: {path}"]


@pytest.mark.parametrize("nodeid, why", [
    ("-p.py::t", "starts with '-'"), ("--pdb.py::t", "starts with '-'"),
    ("tests/" + "x" * 200_000 + ".py::t", "longer than"),
    ("tests/" + "x" * 300 + ".py::t", "longer than 255"),
])
def test_parse_task_refuses_ids_that_pytest_would_misread(nodeid, why):
  t = rf.task("a" * 40, "")
  t["FAIL_TO_PASS"] = [nodeid]
  with pytest.raises(TaskError, match=f"^FAIL_TO_PASS: .*{why}"):
    parse_task(t)


def test_walk_tree_survives_deep_and_huge_trees(tmp_path):
  from dockyard.sandbox.isolation import OVERFLOW_KEY, walk_tree
  fd = os.open(tmp_path, os.O_RDONLY)
  try:  # 1,600 levels, made relative to a directory fd (the absolute path would pass PATH_MAX)
    for _ in range(1600):
      os.mkdir("d", dir_fd=fd)
      new = os.open("d", os.O_RDONLY, dir_fd=fd)
      os.close(fd)
      fd = new
  finally:
    os.close(fd)
  try:
    tree = walk_tree(str(tmp_path))
    capped = walk_tree(str(tmp_path), max_entries=100)
  finally:  # rm copes with the depth; pytest's own tmp cleanup (shutil.rmtree) would not
    subprocess.run(["rm", "-rf", str(tmp_path / "d")], check=True)
  assert len(tree) == 1600 and OVERFLOW_KEY not in tree
  assert OVERFLOW_KEY in capped
  assert integrity.run_findings({}, capped)[0].startswith("run_wrote_too_many_files")


def test_twins_copy_f2p_tests_under_plausible_random_names():
  import random
  from dockyard.sandbox import twins
  src = textwrap.dedent("""\
      import pytest, unittest

      @pytest.mark.parametrize("x", [1, 2])
      def test_parse_value(x):
        assert x

      class TestOrder:
        def test_items_sorted(self):
          assert True

      class Case(unittest.TestCase):
        def testRange(self):
          self.assertTrue(True)
      """)
  ids = ["t.py::test_parse_value[1]", "t.py::test_parse_value[2]",
         "t.py::TestOrder::test_items_sorted", "t.py::Case::testRange"]
  out, made = twins.add_twins({"t.py": src}, ids, random.Random(0), limit=3, tail="_tl")
  assert len({t.name for t in made}) == 3 and len(made) == 4
  new = out["t.py"]
  compile(new, "t.py", "exec")
  for t in made:
    assert f"def {t.name}(" in new and t.name.startswith("test")
    assert "dockyard" not in t.name and "canary" not in t.name
    path, *_ = t.twin.split("::")
    assert path == "t.py" and t.twin.rsplit("::", 1)[0] == t.original.rsplit("::", 1)[0]
  # The same body, decorators included, the same poison call last in both; nothing in the
  # source tells twin from original but the name.
  assert new.count('@pytest.mark.parametrize("x", [1, 2])') == 2
  assert new.count("  assert x\n  _tl()\n") == 2
  assert new.count("    self.assertTrue(True)\n    _tl()\n") == 2
  assert new.count("_tl()") == 6


def test_twins_skip_functions_whose_tail_might_not_run():
  import random
  from dockyard.sandbox import twins
  src = textwrap.dedent("""\
      def test_early(x=1):
        if x:
          return
        assert x

      def test_one_line(): assert True

      def test_nested_return_is_fine():
        def helper():
          return 1
        assert helper()
      """)
  ids = ["t.py::test_early", "t.py::test_one_line", "t.py::test_nested_return_is_fine"]
  out, made = twins.add_twins({"t.py": src}, ids, random.Random(1), limit=3, tail="_tl")
  assert [t.original for t in made] == ["t.py::test_nested_return_is_fine"]
  assert out["t.py"].count("_tl()") == 2 and "return\n  _tl" not in out["t.py"]
  compile(out["t.py"], "t.py", "exec")


def test_live_sandbox_processes_counts_only_this_process_survivors():
  import time
  from dockyard.sandbox import isolation
  drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
  # Another executor's sandbox: a uid-65534 process this process never ran as a sandbox.
  foreign = subprocess.Popen([*drop, "sleep", "30"])
  # A sandbox pid 1 of ours that survived its kill, with a child.
  ours = subprocess.Popen([*drop, "sh", "-c", "sleep 30 & wait"])
  child = None
  try:
    deadline = time.monotonic() + 10
    while child is None and time.monotonic() < deadline:
      child = next((int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(p) == ours.pid
                    and _comm(p) == "sleep"), None)
      time.sleep(0.02)
    assert child is not None
    assert isolation.live_sandbox_processes() == []
    isolation._remember_if_alive(ours.pid)
    found = isolation.live_sandbox_processes()
    assert sorted(found) == sorted([f"{ours.pid} sh", f"{child} sleep"]), found
  finally:
    for proc in (foreign, ours):
      proc.kill()
      proc.wait()
    if child is not None:
      os.kill(child, 9)
  assert isolation.live_sandbox_processes() == []


def _ppid(pid):
  try:
    with open(f"/proc/{pid}/stat") as f:
      return int(f.read().rsplit(")", 1)[1].split()[1])
  except (OSError, ValueError, IndexError):
    return None


def _comm(pid):
  try:
    with open(f"/proc/{pid}/comm") as f:
      return f.read().strip()
  except OSError:
    return None


def test_twin_oracle_answers_each_item_once_and_flags_misuse():
  import asyncio
  from dockyard.sandbox.executor import _answer_twins

  async def ask(lines):
    ask_r, ask_w = os.pipe()
    answer_r, answer_w = os.pipe()
    oracle = asyncio.ensure_future(_answer_twins(ask_r, answer_w, frozenset({"test_twin"})))
    os.write(ask_w, b"".join(lines))
    os.close(ask_w)
    findings = await oracle
    with os.fdopen(answer_r, "rb") as f:
      return f.read(), findings

  ok = [json.dumps({"nodeid": "t.py::test_a", "name": "test_a"}).encode() + b"\n",
        json.dumps({"nodeid": "t.py::test_twin[1]", "name": "test_twin"}).encode() + b"\n"]
  assert asyncio.run(ask(ok)) == (b"01", [])
  # The code under test asking ahead (a second ask of one item) or writing junk: a finding, and
  # every answer from then on poisons.
  answers, findings = asyncio.run(ask(ok + ok[:1] + [b"not json\n"] + ok[:1]))
  assert answers == b"01111"
  assert findings == ["oracle_misused: t.py::test_a asked twice",
                      "oracle_misused: a line that is not an ask"], findings
