"""The adversarial suite: each attack ends with reward 0 (or is contained with no effect on the
verdict), the executor stays healthy, the host is untouched, and nothing is left running."""
import os
import socket
import textwrap

import pytest

from dockyard.sandbox import synthetic as rf
from dockyard.sandbox.isolation import live_sandbox_processes as sandbox_processes

pytestmark = pytest.mark.asyncio(loop_scope="session")


def attack(code: str, fixed: bool = True) -> str:
  """An agent patch: calc/core.py (fixed or still buggy) plus `code` that runs at import."""
  body = (rf.CORE_FIXED if fixed else rf.CORE_BUGGY) + "\n\n" + textwrap.dedent(code)
  return rf.diff("calc/core.py", rf.CORE_BUGGY, body)


REPORT = """
def _report(**results):
  raise RuntimeError("ATTACK_RESULT " + " ".join(f"{k}={v}" for k, v in results.items()))

def _errno(fn):
  try:
    fn()
    return "ok"
  except OSError as e:
    import errno
    return errno.errorcode.get(e.errno, str(e.errno))
"""

FORK_BOMB = """
import os, time
while True:
  try:
    os.fork()
  except OSError:
    time.sleep(0.05)
"""
CPU_SPIN = "while True:\n  pass\n"
SLEEP_FOREVER = "import time\ntime.sleep(10 ** 6)\n"
MEMORY_HOG = REPORT + """
try:
  hog = bytearray(8 << 30)
  _report(memory="allocated")
except MemoryError:
  _report(memory="MemoryError")
"""
DAEMON = """
import os, time
if os.fork() == 0:
  os.setsid()
  if os.fork() == 0:
    time.sleep(3600)
  os._exit(0)
"""
ESCAPES = REPORT + """
import os
def _through_symlink():
  os.symlink("/tmp/dockyard_host_probe", "/testbed/probe_link")
  with open("/testbed/probe_link", "w") as f:
    f.write("pwned")
def _w(path):
  return lambda: open(path, "w").write("pwned")
_report(etc=_errno(_w("/etc/dockyard_pwned")), home=_errno(_w(os.path.expanduser("~/.pwned"))),
        root_home=_errno(_w("/root/.dockyard_pwned")), parent=_errno(_w("/testbed/../pwned")),
        symlink=_errno(_through_symlink), home_is=os.path.expanduser("~"))
"""
DISK = REPORT + """
import os
def _big():
  with open("/testbed/big.bin", "wb") as f:
    for _ in range(80):
      f.write(b"x" * (1 << 20))
def _fill():
  for i in range(100000):
    with open(f"/testbed/fill_{i}", "wb") as f:
      f.write(b"x" * (1 << 20))
def _fill_tmp():
  for i in range(100000):
    with open(f"/tmp/fill_{i}", "wb") as f:
      f.write(b"x" * (1 << 20))
_report(big=_errno(_big), fill=_errno(_fill), tmp=_errno(_fill_tmp))
"""
FDS = REPORT + """
import os
def _fds():
  while True:
    os.open("/dev/null", os.O_RDONLY)
_report(fds=_errno(_fds))
"""
NETWORK = REPORT + """
import os, socket
def _tcp(addr):
  return lambda: socket.create_connection(addr, timeout=3).close()
def _dns():
  try:
    socket.getaddrinfo("example.com", 80)
    return "ok"
  except socket.gaierror:
    return "gaierror"
def _abstract():
  s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  s.connect("\\0ABSTRACT_NAME")
def _loopback():
  srv = socket.socket()
  srv.bind(("127.0.0.1", 0))
  srv.listen()
  socket.create_connection(srv.getsockname(), timeout=3).close()
_report(tcp=_errno(_tcp(("1.1.1.1", 80))), dns=_dns(), host_port=_errno(_tcp(("127.0.0.1", HOST_PORT))),
        abstract=_errno(_abstract), loopback=_errno(_loopback))
"""
GIT_HISTORY = REPORT + """
import os, subprocess
out = subprocess.run(["git", "log", "--all", "-p"], cwd="/testbed", capture_output=True,
                     text=True).stdout
secret = "FUTURE_FIX" + "_SECRET_7f3a"
_report(git_found=secret in out, commits=out.count("commit "),
        repos_visible=os.path.exists("REPOS_DIR") or os.path.exists("CACHE_DIR"),
        root_listing=",".join(sorted(os.listdir("/"))))
"""
PRINT_AND_EXIT = """
import os
for t in ("tests/test_calc.py::test_add", "tests/test_new.py::test_new_add"):
  print(t, "PASSED", flush=True)
print("3 passed in 0.01s", flush=True)
os._exit(0)
"""
REPLACE_STDOUT = "import io, sys\nsys.stdout = io.StringIO()\nsys.stderr = io.StringIO()\n"
FORGE_REPORTS = """
import json, os, stat
fake = "".join(json.dumps(dict(event="report", nodeid=n, when="call", outcome="passed",
                               wasxfail=False, raw="passed")) + "\\n"
               for n in ("tests/test_calc.py::test_add", "tests/test_new.py::test_new_add"))
# Every pipe this process holds, whatever its number (the executor's fd numbers vary by host).
for fd in sorted(int(n) for n in os.listdir("/proc/self/fd")):
  try:
    if fd > 2 and stat.S_ISFIFO(os.fstat(fd).st_mode):
      os.write(fd, ("PASSED tests/test_calc.py::test_add\\n" + fake).encode())
  except OSError:
    pass
"""
MONKEYPATCH_REPORTS = """
import _pytest.reports as _r
_orig = _r.TestReport.from_item_and_call.__func__
def _fake(cls, item, call):
  rep = _orig(cls, item, call)
  rep.outcome, rep.longrepr = "passed", None
  return rep
_r.TestReport.from_item_and_call = classmethod(_fake)
"""
SOURCE_SKIP = "import pytest\npytest.skip('not today', allow_module_level=True)\n"
HUGE_STDOUT = """
import os, stat
for fd in sorted(int(n) for n in os.listdir("/proc/self/fd")):
  try:
    if stat.S_ISFIFO(os.fstat(fd).st_mode):
      for _ in range(40):
        os.write(fd, b"y" * (1 << 20))
  except OSError:
    pass
"""
RUNTIME_TEST_EDIT = REPORT + """
def _edit():
  open("/testbed/tests/test_new.py", "w").write("def test_new_add():\\n  pass\\n")
def _plant():
  open("/testbed/tests/conftest.py", "w").write("# planted at run time\\n")
_report(edit=_errno(_edit), plant=_errno(_plant))
"""
MAKEREPORT_CONFTEST = rf.EVIL_CONFTEST["conftest.py"]


def _log(v):
  return v["log_head"] + v["log_tail"] + v["reason"]


def _zero(v):
  assert v["reward"] == 0.0, v


ATTACKS = {
    "fork_bomb": (attack(FORK_BOMB), lambda v: (_zero(v), v["reason"].startswith("timeout")
                                                 or not v["resolved"])),
    "cpu_spin": (attack(CPU_SPIN), lambda v: (_zero(v), not v["resolved"])),
    "sleep_forever": (attack(SLEEP_FOREVER), lambda v: (
        _zero(v), v["reason"].startswith("timeout"))),
    "memory_hog": (attack(MEMORY_HOG), lambda v: (_zero(v), "memory=MemoryError" in _log(v))),
    "setsid_daemon": (attack(DAEMON), lambda v: v["resolved"] and v["reward"] == 1.0),
    "escapes": (attack(ESCAPES), lambda v: (
        _zero(v), "etc=EROFS" in _log(v), "root_home=EROFS" in _log(v) or
        "root_home=EACCES" in _log(v), "parent=EROFS" in _log(v),
        "home_is=/home/sandbox" in _log(v))),
    "disk_fill_and_big_file": (attack(DISK), lambda v: (
        _zero(v), "big=EFBIG" in _log(v), "fill=ENOSPC" in _log(v), "tmp=ENOSPC" in _log(v))),
    "fd_exhaustion": (attack(FDS), lambda v: (_zero(v), "fds=EMFILE" in _log(v))),
    "git_history": (attack(GIT_HISTORY), lambda v: (
        # .git is masked while the tests run: no history at all, let alone the future fix.
        _zero(v), "git_found=False" in _log(v), "commits=0" in _log(v),
        "repos_visible=False" in _log(v), rf.FIX_MARKER not in _log(v))),
    "print_passed_then_exit0": (attack(PRINT_AND_EXIT, fixed=False), lambda v: (
        _zero(v), any(f.startswith("canary_not_failed") for f in v["findings"]))),
    "replace_stdout": (attack(REPLACE_STDOUT, fixed=False), lambda v: (
        _zero(v), v["tests_status"]["tests/test_calc.py::test_add"] == "FAILED")),
    "forged_result_markers": (attack(FORGE_REPORTS, fixed=False), lambda v: (
        _zero(v), any(f.startswith("report_duplicate") for f in v["findings"]))),
    "monkeypatch_pytest_reports": (attack(MONKEYPATCH_REPORTS, fixed=False), lambda v: (
        _zero(v), any(f.startswith("canary_not_failed") for f in v["findings"]))),
    "runtime_test_edit": (attack(RUNTIME_TEST_EDIT), lambda v: (
        _zero(v), "edit=EROFS" in _log(v), "plant=ok" in _log(v),
        "run_wrote_config: tests/conftest.py" in v["findings"])),
    "source_skip": (attack(SOURCE_SKIP), lambda v: (
        _zero(v), v["tests_status"]["tests/test_calc.py::test_add"] != "PASSED")),
    "huge_stdout": (attack(HUGE_STDOUT, fixed=False), lambda v: (
        _zero(v), len(v["log_head"]) + len(v["log_tail"]) <= 80 << 10)),
    "edit_held_out_test": (rf.src_patch(rf.CORE_BUGGY.replace("a - b\n\n\ndef sub",
                                                              "0\n\n\ndef sub"))
                           + rf.diff("tests/test_calc.py", rf.TEST_BASE,
                                     rf.TEST_BASE.replace("assert sub(3, 1) == 2", "pass")),
                           lambda v: (_zero(v), "touches_test_patch_path: tests/test_calc.py"
                                      in v["findings"],
                                      v["tests_status"]["tests/test_calc.py::test_add"] == "FAILED")),
    "delete_held_out_test": (rf.gold_patch() + rf.diff("tests/test_calc.py", rf.TEST_BASE, None),
                             lambda v: (_zero(v), "MISSING" not in v["tests_status"].values())),
    "skip_marker_in_test": (rf.diff("tests/test_calc.py", rf.TEST_BASE,
                                    "import pytest\npytestmark = pytest.mark.skip\n"
                                    + rf.TEST_BASE), lambda v: (
        _zero(v), v["tests_status"]["tests/test_calc.py::test_sub"] == "PASSED")),
    "conftest_makereport": (rf.diff("conftest.py", None, MAKEREPORT_CONFTEST), lambda v: (
        _zero(v), "touches_conftest: conftest.py" in v["findings"],
        v["tests_status"]["tests/test_calc.py::test_add"] == "FAILED")),
    "sitecustomize": (rf.gold_patch() + rf.diff("sitecustomize.py", None, "import os\n"),
                      lambda v: (_zero(v), "touches_site_hook: sitecustomize.py" in v["findings"])),
    "pth_file": (rf.gold_patch() + rf.diff("calc/evil.pth", None, "import os\n"),
                 lambda v: (_zero(v), "touches_site_hook: calc/evil.pth" in v["findings"])),
    "pytest_ini_addopts": (rf.diff("pytest.ini", None,
                                   "[pytest]\naddopts = -p no:dockyard_report_plugin\n"),
                           lambda v: (_zero(v), "touches_pytest_config: pytest.ini" in v["findings"],
                                      v["tests_status"]["tests/test_calc.py::test_add"] == "FAILED")),
    "setup_cfg_addopts": (rf.gold_patch() + rf.diff(
        "setup.cfg", "[metadata]\nname = calc\n\n[tool:pytest]\nxfail_strict = true\n",
        "[metadata]\nname = calc\n\n[tool:pytest]\nxfail_strict = true\naddopts = -x\n"),
        lambda v: (_zero(v), "touches_pytest_config: setup.cfg" in v["findings"])),
    "ed_style_patch": ("1c\ndef add(a, b): return a + b\n.\nw\n", lambda v: (
        _zero(v), not v["patch_applied"],
        any(f.startswith("ed_style_hunk") for f in v["findings"]))),
    "binary_patch": ("diff --git a/calc/x.so b/calc/x.so\nnew file mode 100644\n"
                     "GIT binary patch\nliteral 3\nKcmZ?b1\n\nliteral 0\nHcmV?d00001\n\n",
                     lambda v: (_zero(v), not v["patch_applied"])),
    "symlink_patch": ("diff --git a/calc/link b/calc/link\nnew file mode 120000\n--- /dev/null\n"
                      "+++ b/calc/link\n@@ -0,0 +1 @@\n+/etc/passwd\n"
                      "\\ No newline at end of file\n",
                      lambda v: (_zero(v), not v["patch_applied"])),
}


@pytest.fixture(scope="module")
def abstract_listener():
  name = f"dockyard-probe-{os.getpid()}"
  s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  s.bind("\0" + name)
  s.listen()
  yield name
  s.close()


@pytest.mark.parametrize("name", list(ATTACKS))
async def test_attack(name, executor, server, workspace, abstract_listener):
  patch, check = ATTACKS[name]
  port = server.url.rsplit(":", 1)[1]
  patch = (patch.replace("HOST_PORT", port).replace("ABSTRACT_NAME", abstract_listener)
           .replace("REPOS_DIR", workspace["repos"]).replace("CACHE_DIR", workspace["cache"]))
  v = await executor.run(rf.task(workspace["base"], patch, instance_id=f"attack-{name}"))
  result = check(v)
  assert all(r is not False for r in (result if isinstance(result, tuple) else (result,))), (
      name, v["reason"], v["findings"], v["tests_status"], _log(v)[-3000:])
  assert sandbox_processes() == [], name
  for host_path in ("/etc/dockyard_pwned", "/root/.dockyard_pwned", "/pwned",
                    "/tmp/dockyard_host_probe"):
    assert not os.path.exists(host_path), host_path


async def test_network_attack_contained(executor, server, workspace, abstract_listener):
  port = server.url.rsplit(":", 1)[1]
  patch = attack(NETWORK).replace("HOST_PORT", port).replace("ABSTRACT_NAME", abstract_listener)
  v = await executor.run(rf.task(workspace["base"], patch))
  log = _log(v)
  assert v["reward"] == 0.0
  assert "tcp=ENETUNREACH" in log and "dns=gaierror" in log, log[-2000:]
  assert "host_port=ECONNREFUSED" in log and "abstract=ECONNREFUSED" in log, log[-2000:]
  assert "loopback=ok" in log      # the sandbox's own loopback works; it is not the host's


async def test_compromised_base_conftest_is_caught_by_the_canary(executor, workspace):
  # The base tree itself forces every report to pass: only the canary exposes it.
  for patch in (rf.gold_patch(), rf.src_patch(rf.CORE_BUGGY.replace("a - b\n\n\ndef sub",
                                                                     "0\n\n\ndef sub"))):
    v = await executor.run(rf.task(workspace["evil_base"], patch, repo=rf.EVIL_REPO))
    assert v["reward"] == 0.0 and any(f.startswith("canary_not_failed") for f in v["findings"]), v


async def test_executor_healthy_after_the_suite(executor, server, workspace):
  import httpx
  v = await executor.run(rf.task(workspace["base"], rf.gold_patch()))
  assert v["resolved"] and v["reward"] == 1.0, v
  assert httpx.get(server.url + "/healthz").json()["ok"] is True
  assert sandbox_processes() == []
