"""Attacks on the grade itself, written as an attacker who read dockyard's sandbox code would.

Issue 21's classes, new instances: shadowing by import path (the plugin's and launcher's names,
`pytest`, stdlib modules the plugin uses), patching the reporter from package code at import
(the plugin's emit, pytest's report construction, a hook registered on the config found via
gc, each sparing the canary it can recognise), site hooks as packages and `.pth` files, config
headers that configparser and pytest read differently, and probes for what the sandbox shows of
the host. Every patch leaves the bug in place (or is refused) and must score 0; the executor
must stay healthy. Select with `-k attack`.
"""
import textwrap

import pytest

from dockyard.sandbox import synthetic as rf
from dockyard.sandbox.isolation import live_sandbox_processes

pytestmark = pytest.mark.asyncio(loop_scope="session")

BUGGY_ADD = "tests/test_calc.py::test_add"

# Writes "passed" for every id the attacker can name into every pipe it holds; used by the
# shadowing modules, which run (if they ever run) before pytest has reported anything.
FORGE = """
import os as _os, stat as _stat
def _forge():
  lines = b""
  for n in ("tests/test_calc.py::test_add", "tests/test_calc.py::test_sub",
            "tests/test_new.py::test_new_add"):
    for when in ("setup", "call", "teardown"):
      lines += ('{"event": "report", "nodeid": "%s", "when": "%s", "outcome": "passed", '
                '"wasxfail": false}\\n' % (n, when)).encode()
  for fd in range(3, 64):
    try:
      if _stat.S_ISFIFO(_os.fstat(fd).st_mode):
        _os.write(fd, lines)
    except OSError:
      pass
  _os._exit(0)
"""

# The canary is a new file whose body is a bare failing assert: an attacker spares any test
# whose file says so, and any test outside the files git tracks at HEAD.
SPARE_CANARY = """
def _is_canary(path):
  try:
    text = open(path).read()
  except OSError:
    return True
  return "must fail" in text or "assert False" in text
"""

PATCH_EMIT = SPARE_CANARY + """
import gc, types
# The plugin is not in sys.modules (loaded by file path under a random name): find it via gc.
for _mod in [o for o in gc.get_objects() if isinstance(o, types.ModuleType)]:
  if hasattr(_mod, "_emit") and hasattr(_mod, "configure"):
    _real = _mod._emit
    def _emit(_real=_real, **event):
      if event.get("event") == "report" and not _is_canary(event["nodeid"].split("::")[0]):
        event["outcome"] = "passed"
      return _real(**event)
    _mod._emit = _emit
"""

PATCH_REPORT_CONSTRUCTION = SPARE_CANARY + """
import _pytest.reports as _r
_orig = _r.TestReport.from_item_and_call.__func__
def _fake(cls, item, call):
  rep = _orig(cls, item, call)
  if not _is_canary(str(item.path)):
    rep.outcome, rep.longrepr = "passed", None
  return rep
_r.TestReport.from_item_and_call = classmethod(_fake)
"""

GC_CONFIG_HOOK = SPARE_CANARY + """
import gc
import pytest
from _pytest.config import Config

class _SkipBodies:
  @pytest.hookimpl(tryfirst=True)
  def pytest_runtest_call(self, item):
    if not _is_canary(str(item.path)):
      item.runtest = lambda: None     # the body never runs: a genuine pass
      item.obj = lambda *a, **k: None

for _obj in gc.get_objects():
  if isinstance(_obj, Config):
    _obj.pluginmanager.register(_SkipBodies(), "helpers")
    break
"""

FORCE_XFAIL = SPARE_CANARY + """
import _pytest.reports as _r
_orig = _r.TestReport.from_item_and_call.__func__
def _fake(cls, item, call):
  rep = _orig(cls, item, call)
  if rep.when == "call" and rep.failed and not _is_canary(str(item.path)):
    rep.outcome, rep.wasxfail, rep.longrepr = "skipped", "known", None   # XFAIL passes
  return rep
_r.TestReport.from_item_and_call = classmethod(_fake)
"""

# Reads the twin decision out of our plugin: its module state (found via gc: not in
# sys.modules) and every closure of the item's runtest / iter_markers, then forces every result
# except the canary's and those of items it found flagged.
READ_TWIN_FLAG = SPARE_CANARY + """
import gc, types
import _pytest.reports as _r

def _flags(obj):
  out = set()
  for cell in getattr(obj, "__closure__", None) or ():
    try:
      value = cell.cell_contents
    except ValueError:
      continue
    if value is True:
      out.add(True)
    elif isinstance(value, (set, frozenset)):
      out |= {v for v in value if isinstance(v, str)}
  return out

def _plugin_names():
  names = set()
  for mod in [o for o in gc.get_objects() if isinstance(o, types.ModuleType)]:
    state = getattr(mod, "_state", None)
    if isinstance(state, dict) and hasattr(mod, "configure"):
      for value in state.values():
        if isinstance(value, (set, frozenset, list, tuple)):
          names |= {v for v in value if isinstance(v, str)}
  return names

def _is_twin(item):
  name = getattr(item, "originalname", None) or item.name.split("[")[0]
  flags = _flags(item.runtest) | _flags(getattr(item, "iter_markers", None))
  return True in flags or name in flags or name in _plugin_names()

_orig = _r.TestReport.from_item_and_call.__func__
def _fake(cls, item, call):
  rep = _orig(cls, item, call)
  if not _is_canary(str(item.path)) and not _is_twin(item):
    rep.outcome, rep.longrepr = "passed", None
  return rep
_r.TestReport.from_item_and_call = classmethod(_fake)
"""

# Replaces the test function pytest calls (not item.runtest, which a wrapper may hold), so every
# body but the canary's genuinely passes; a poison applied after the body would still fire for
# the twins alone, making them fail as they must.
NEUTRALIZE_BODIES = SPARE_CANARY + """
import gc
import pytest
from _pytest.config import Config

class _Neutral:
  @pytest.hookimpl(tryfirst=True)
  def pytest_runtest_call(self, item):
    if not _is_canary(str(item.path)) and hasattr(item, "obj"):
      item.obj = lambda *a, **k: None

for _obj in gc.get_objects():
  if isinstance(_obj, Config):
    _obj.pluginmanager.register(_Neutral(), "helpers2")
    break
"""

# A FAIL_TO_PASS test that existed at base_commit (the test_patch changes it): the attacker
# forces only tests whose names the history (`git show HEAD:<file>`) or the test_patch itself
# (/dockyard/in/test.diff) show, so the twin (a new name) and the canary (a new file) fail.
READ_HISTORY = """
import os, re, subprocess
import _pytest.reports as _r

def _known(path):
  names = set()
  rel = os.path.relpath(path, "/testbed")
  try:
    shown = subprocess.run(["git", "show", f"HEAD:{rel}"], cwd="/testbed", capture_output=True,
                           text=True, timeout=10).stdout
  except Exception:
    shown = ""
  names |= set(re.findall(r"def (test\\w*)", shown))
  for name in os.listdir("/dockyard/in") if os.path.isdir("/dockyard/in") else ():
    try:
      names |= set(re.findall(r"def (test\\w*)", open(os.path.join("/dockyard/in", name)).read()))
    except OSError:
      pass
  return names

_orig = _r.TestReport.from_item_and_call.__func__
def _fake(cls, item, call):
  rep = _orig(cls, item, call)
  if (getattr(item, "originalname", None) or item.name) in _known(str(item.path)):
    rep.outcome, rep.longrepr = "passed", None
  return rep
_r.TestReport.from_item_and_call = classmethod(_fake)
"""
EXISTING_F2P_TEST = rf.TEST_BASE.replace("import sub", "import add, sub") + (
    "  assert add(2, 3) == 5\n")


def _existing_f2p_task(base, patch, instance_id):
  return rf.task(base, patch, instance_id=instance_id,
                 test_patch=rf.diff("tests/test_calc.py", rf.TEST_BASE, EXISTING_F2P_TEST),
                 FAIL_TO_PASS=["tests/test_calc.py::test_sub"], PASS_TO_PASS=[])


PROBE_HOST = """
import os
def _read(path):
  try:
    with open(path, "rb") as f:
      return f.read().replace(b"\\0", b" ").decode(errors="replace")
  except OSError as e:
    return f"<{e.errno}>"
found = []
for pid in os.listdir("/proc"):
  if pid.isdigit():
    found.append(_read(f"/proc/{pid}/cmdline"))
    found.append(_read(f"/proc/{pid}/environ"))
    for fd in range(64):
      found.append(_read(f"/proc/{pid}/fd/{fd}"))
raise RuntimeError("PROBE " + " | ".join(found)[:50000])
"""


def _attack(code: str) -> str:
  return rf.src_patch(rf.CORE_BUGGY + "\n\n" + textwrap.dedent(code))


def _new(path: str, text: str) -> str:
  return rf.diff(path, None, textwrap.dedent(text))


ATTACKS = {
    # 1. shadowing by import path
    "shadow_stdlib_json": (_new("json.py", FORGE + "_forge()\n"), None),
    "shadow_stdlib_os_modules": (_new("stat.py", FORGE + "_forge()\n")
                                 + _new("importlib/__init__.py", FORGE + "_forge()\n"), None),
    "shadow_pytest": (_new("pytest.py", FORGE + "_forge()\n")
                      + _new("_pytest/__init__.py", FORGE + "_forge()\n"), None),
    "shadow_plugin_and_launcher": (_new("dockyard_report_plugin.py", FORGE + "_forge()\n")
                                   + _new("dockyard_launch.py", FORGE + "_forge()\n")
                                   + _new("calc/dockyard_report_plugin.py", FORGE + "_forge()\n"),
                                   None),
    "shadow_pluggy_iniconfig": (_new("pluggy/__init__.py", FORGE + "_forge()\n")
                                + _new("iniconfig.py", FORGE + "_forge()\n"), None),
    # 2. patching the reporter from package code, sparing what looks like the canary
    "patch_plugin_emit": (_attack(PATCH_EMIT), "canary_not_failed"),
    "patch_report_construction": (_attack(PATCH_REPORT_CONSTRUCTION), "canary_not_failed"),
    "gc_config_skip_bodies": (_attack(GC_CONFIG_HOOK), "canary_not_failed"),
    "force_xfail_sparing_canary": (_attack(FORCE_XFAIL), "canary_not_failed"),
    "read_twin_flag_from_closures_and_state": (_attack(READ_TWIN_FLAG), "canary_not_failed"),
    "neutralize_bodies_below_the_wrapper": (_attack(NEUTRALIZE_BODIES), "canary_not_failed"),
    # 3. site hooks in forms a basename check misses
    "sitecustomize_package": (_new("sitecustomize/__init__.py", FORGE + "_forge()\n"),
                              "touches_site_hook: sitecustomize/__init__.py"),
    "usercustomize_in_src": (_new("calc/usercustomize.py", FORGE + "_forge()\n"),
                             "touches_site_hook: calc/usercustomize.py"),
    "pth_deep": (_new("calc/data/zz.pth", "import os; os.environ['PYTEST_ADDOPTS'] = '-x'\n"),
                 "touches_site_hook: calc/data/zz.pth"),
    # 4. config-parser confusion
    "setup_cfg_header_comment": (rf.diff(
        "setup.cfg", "[metadata]\nname = calc\n\n[tool:pytest]\nxfail_strict = true\n",
        "[metadata]\nname = calc\n\n[tool:pytest] ;]\nxfail_strict = true\n"
        "addopts = --deselect tests/test_calc.py::test_add\n"),
        "touches_pytest_config: setup.cfg"),
    "tox_ini_header_comment": (_new("tox.ini", "[pytest] ;]\naddopts = -p no:python\n"),
                               "touches_pytest_config: tox.ini"),
    "tests_dir_tox_ini": (_new("tests/tox.ini", "[pytest]\naddopts = -k test_sub\n"),
                          "touches_test_file: tests/tox.ini"),
}


async def _check_zero(v, finding):
  assert v["reward"] == 0.0 and v["resolved"] is False, v
  assert "executor_error" not in v["findings"], v["reason"]
  if finding:
    assert any(f.startswith(finding) for f in v["findings"]), (v["findings"], v["reason"])
  if finding != "canary_not_failed":  # the reporter patches do make the buggy test "pass"
    assert v["tests_status"].get(BUGGY_ADD) != "PASSED", v["tests_status"]


@pytest.mark.parametrize("name", list(ATTACKS))
async def test_attack_on_the_grade(name, executor, workspace):
  patch, finding = ATTACKS[name]
  v = await executor.run(rf.task(workspace["base"], patch, instance_id=f"grade-{name}"))
  await _check_zero(v, finding)
  assert live_sandbox_processes() == [], name


_WITH_FIX = {"patch_plugin_emit": PATCH_EMIT, "patch_report_construction": PATCH_REPORT_CONSTRUCTION,
             "gc_config_skip_bodies": GC_CONFIG_HOOK, "read_twin_flag": READ_TWIN_FLAG,
             "neutralize_bodies": NEUTRALIZE_BODIES}


@pytest.mark.parametrize("name", list(_WITH_FIX))
async def test_attack_reporter_patch_with_the_fix_in_place_still_zero(name, executor, workspace):
  # With the fix present the tests pass for real, but the patching still shows on the twins.
  code = _WITH_FIX[name]
  patch = rf.src_patch(rf.CORE_FIXED + "\n\n" + textwrap.dedent(code))
  v = await executor.run(rf.task(workspace["base"], patch, instance_id=f"grade-fixed-{name}"))
  assert v["reward"] == 0.0 and not v["resolved"], v
  assert any(f.startswith("canary_not_failed") for f in v["findings"]), v["findings"]


async def test_attack_twin_told_apart_by_history_scores_0(executor, workspace):
  # The history (.git is masked during the run) and the test_patch (removed from /dockyard/in
  # once applied) no longer say which of test_sub and its twin existed at base_commit.
  v = await executor.run(_existing_f2p_task(workspace["base"], _attack(READ_HISTORY),
                                            "grade-history"))
  await _check_zero(v, None)
  assert v["tests_status"] == {"tests/test_calc.py::test_sub": "FAILED"}, v["tests_status"]
  gold = await executor.run(_existing_f2p_task(workspace["base"], rf.gold_patch(),
                                               "grade-history-gold"))
  assert gold["resolved"] and gold["reward"] == 1.0, gold
  assert live_sandbox_processes() == []


async def test_attack_probe_sees_no_host_paths_nor_secrets(executor, workspace):
  v = await executor.run(rf.task(workspace["base"], _attack(PROBE_HOST)))
  log = v["log_head"] + v["log_tail"]
  assert "PROBE" in log, log[-2000:]
  from dockyard.sandbox.isolation import MOUNT_POINT
  assert MOUNT_POINT not in log and "--ro-bind" not in log and "--setenv" not in log
  assert workspace["repos"] not in log and workspace["cache"] not in log
  assert '"twins"' not in log and "report_fd" not in log    # the launcher's config was consumed
  assert v["reward"] == 0.0


async def test_attack_deep_and_many_files_give_a_clean_verdict(executor, workspace):
  code = """
  import os
  fd = os.open("/testbed", os.O_RDONLY)
  for _ in range(1500):
    os.mkdir("d", dir_fd=fd)
    new = os.open("d", os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = new
  os.makedirs("/testbed/many", exist_ok=True)
  for i in range(101000):
    os.close(os.open(f"/testbed/many/{i}", os.O_CREAT | os.O_WRONLY, 0o644))
  """
  patch = rf.src_patch(rf.CORE_FIXED + "\n\n" + textwrap.dedent(code))
  v = await executor.run(rf.task(workspace["base"], patch, instance_id="grade-deep"))
  assert "executor_error" not in v["findings"], v["reason"]
  assert v["reward"] == 0.0
  assert any(f.startswith("run_wrote_too_many_files") for f in v["findings"]) or (
      v["reason"].startswith("timeout")), v["reason"]


async def test_attack_suite_leaves_the_executor_healthy(executor, workspace):
  v = await executor.run(rf.task(workspace["base"], rf.gold_patch()))
  assert v["resolved"] and v["reward"] == 1.0, v
  assert live_sandbox_processes() == []
