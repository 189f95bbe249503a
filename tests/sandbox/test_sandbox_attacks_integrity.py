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


@pytest.mark.parametrize("name", ["patch_plugin_emit", "patch_report_construction",
                                  "gc_config_skip_bodies"])
async def test_attack_reporter_patch_with_the_fix_in_place_still_zero(name, executor, workspace):
  # With the fix present the tests pass for real, but the patching still shows on the twins.
  code = {"patch_plugin_emit": PATCH_EMIT, "patch_report_construction": PATCH_REPORT_CONSTRUCTION,
          "gc_config_skip_bodies": GC_CONFIG_HOOK}[name]
  patch = rf.src_patch(rf.CORE_FIXED + "\n\n" + textwrap.dedent(code))
  v = await executor.run(rf.task(workspace["base"], patch, instance_id=f"grade-fixed-{name}"))
  assert v["reward"] == 0.0 and not v["resolved"], v
  assert any(f.startswith("canary_not_failed") for f in v["findings"]), v["findings"]


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
