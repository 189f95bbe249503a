"""Session attacks (issue 14, item 9): an agent with a live shell in its session tries to escape,
read another session, reach the network, fork-bomb, leave daemons behind, write into the grading
checkout, edit the tests grading runs, find the future fix in git, and subvert the diff through
.git. Each is contained, scores 0 where it is a hack, and the executor stays healthy."""
import asyncio
import os
import socket

import httpx
import pytest

from dockyard.sandbox import synthetic as rf
from dockyard.sandbox.client import SandboxClient, SessionToolError
from tests.sandbox.session_helpers import FIX, processes_with

pytestmark = pytest.mark.asyncio(loop_scope="session")
HOST_PROBES = ("/etc/dockyard_session_pwned", "/root/.dockyard_session_pwned",
               "/dockyard_session_pwned")


@pytest.fixture
async def client(server):
  async with SandboxClient([server.url]) as c:
    yield c


def _session_task(workspace, instance_id="session-attack"):
  return rf.task(workspace["base"], "", instance_id=instance_id)


async def test_attack_session_escape_is_contained(client, workspace, tmp_path):
  # host secrets where a sandbox that saw the host would find them
  secrets = [os.path.join(os.path.expanduser("~"), f".dockyard_session_secret_{os.getpid()}"),
             str(tmp_path / "host_secret")]
  for path in secrets:
    with open(path, "w") as f:
      f.write("HOST_SECRET")
  try:
    await _escape(client, workspace, secrets)
  finally:
    for path in secrets:
      os.remove(path)
  for path in HOST_PROBES + ("/tmp/dockyard_session_probe",):
    assert not os.path.exists(path), path


async def _escape(client, workspace, secrets):
  async with await client.open_session(_session_task(workspace)) as s:
    probe = "; ".join(f"(echo pwned > {p}) 2>/dev/null && echo WROTE {p}" for p in HOST_PROBES)
    probe += "".join(f"; cat {p} 2>/dev/null" for p in secrets)
    run = await s.exec(probe + "; id -u; cat /etc/shadow >/dev/null 2>&1 && echo READ_SHADOW; "
                       "ls /proc | grep -cE '^[0-9]+$'; "
                       f"ls {workspace['cache']} 2>/dev/null && echo SAW_CACHE; "
                       f"ls {workspace['repos']} 2>/dev/null && echo SAW_REPOS; "
                       "echo x > /usr/pwned 2>/dev/null && echo WROTE_USR; true")
    out = run["stdout"].split()
    assert "WROTE" not in out and "READ_SHADOW" not in out and "HOST_SECRET" not in out, run
    assert "SAW_CACHE" not in out and "SAW_REPOS" not in out and "WROTE_USR" not in out, run
    assert out[0] == "65534" and int(out[1]) <= 6, run   # not root; its own pid namespace only
    # the file tools refuse paths out, symlinks out included, and cannot be tricked into writing
    await s.exec("ln -s /etc out_link; ln -s /tmp/dockyard_session_probe file_link")
    for tool, args in [("view", dict(path="out_link/passwd")), ("view", dict(path="/etc/passwd")),
                       ("create", dict(path="file_link", content="pwned", overwrite=True)),
                       ("create", dict(path="out_link/dockyard_session_pwned", content="x")),
                       ("edit", dict(path="../../../etc/passwd", old_str="root", new_str="x")),
                       ("search", dict(pattern="root", path="/proc/1/root/etc"))]:
      with pytest.raises(SessionToolError, match="outside the checkout"):
        await s.tool(tool, **args)


async def test_attack_session_reads_another_sessions_files(client, workspace):
  secret = "SESSION_SECRET_91c2"
  async with await client.open_session(_session_task(workspace, "victim")) as victim, \
      await client.open_session(_session_task(workspace, "thief")) as thief:
    await victim.tool("create", path="secret.txt", content=secret)
    await victim.exec(f"echo {secret} > /tmp/secret.txt; echo {secret} > ~/secret.txt")
    hunt = await thief.exec(
        "cat /testbed/secret.txt /proc/*/root/testbed/secret.txt 2>/dev/null; "
        "grep -rs SESSION_SECRET /testbed /tmp /home /dockyard /proc/*/root/testbed 2>/dev/null; "
        "find / -xdev -name secret.txt 2>/dev/null; true", timeout_s=6)
    assert secret not in hunt["stdout"], hunt
    with pytest.raises(SessionToolError, match="no such file"):
      await thief.tool("view", path="secret.txt")
    assert (await victim.tool("view", path="secret.txt"))["output"].endswith(secret)


async def test_attack_session_network_is_unreachable(client, workspace):
  listener = socket.socket()
  listener.bind(("127.0.0.1", 0))
  listener.listen()
  port = listener.getsockname()[1]
  try:
    async with await client.open_session(_session_task(workspace)) as s:
      code = ("import socket\n"
              "def go(addr):\n"
              "  try:\n"
              "    socket.create_connection(addr, timeout=2).close(); return 'ok'\n"
              "  except OSError as e:\n"
              "    return type(e).__name__\n"
              f"print('host', go(('127.0.0.1', {port})))\n")
      await s.tool("create", path="net_probe.py", content=code)
      # /proc/net/dev: the interfaces of the session's network namespace (loopback only)
      run = await s.exec("python net_probe.py; tail -n +3 /proc/net/dev | cut -d: -f1",
                         timeout_s=6)
      assert run["stdout"].split() == ["host", "ConnectionRefusedError", "lo"], run
  finally:
    listener.close()


async def test_attack_session_fork_bomb_is_contained(client, workspace, server):
  async with await client.open_session(_session_task(workspace)) as s:
    bomb = await s.exec("f() { f | f & }; f; sleep 10", timeout_s=4)
    assert bomb["timed_out"] or bomb["exit_code"] != 0
    assert (await s.exec("echo alive"))["stdout"] == "alive\n"
  assert httpx.get(server.url + "/healthz", timeout=10).json()["ok"]


async def test_attack_session_daemons_do_not_outlive_the_command_nor_delete(client, workspace):
  marker = "dockyard_session_daemon_4244"
  code = ("import os, time, sys\n"
          "if os.fork() == 0:\n"
          "  os.setsid()\n"
          "  if os.fork() == 0:\n"
          f"    sys.argv[0] = '{marker}'\n"
          f"    os.execvp('bash', ['bash', '-c', 'exec -a {marker}_py sleep 1000'])\n"
          "  os._exit(0)\n")
  s = await client.open_session(_session_task(workspace))
  await s.tool("create", path="daemon.py", content=code)
  run = await s.exec(f"python daemon.py; (setsid nohup bash -c 'exec -a {marker}_sh sleep 1000' "
                     "> /dev/null 2>&1 &); disown -a; echo started")
  assert run["stdout"] == "started\n" and not run["timed_out"], run
  assert processes_with(marker) == []   # gone with the command's pid namespace
  await s.exec(f"(exec -a {marker}_bg sleep 1000 &) ; true")
  await s.close()
  assert processes_with(marker) == []


async def test_attack_session_cannot_write_into_the_grading_checkout(client, workspace):
  # The agent leaves a buggy tree and a delayed background writer meant to "fix" whatever
  # checkout it can see while grading runs; another session hammers every tree it can see
  # (through /proc, its own included) meanwhile. The grading checkout is in no session's view.
  loop = ("for i in $(seq 150); do for d in /proc/[0-9]*/root/testbed /proc/[0-9]*/cwd; do "
          f"printf '%s' '{rf.CORE_FIXED}' > $d/calc/core.py 2>/dev/null; done; sleep 0.05; done")
  s = await client.open_session(_session_task(workspace, "writer"))
  other = await client.open_session(_session_task(workspace, "hammer"))
  await s.tool("edit", path="calc/core.py", old_str="def sub", new_str="# touched\ndef sub")
  await s.exec(f"(sleep 0.3; {loop}) > /dev/null 2>&1 & true")
  hammer = asyncio.ensure_future(other.exec(loop + "; true", timeout_s=6))
  verdict = await s.submit()
  await hammer
  await other.close()
  assert verdict["reward"] == 0.0 and not verdict["resolved"], verdict
  assert verdict["tests_status"]["tests/test_calc.py::test_add"] == "FAILED", verdict


async def test_attack_session_edited_tests_are_restored_and_score_zero(client, workspace):
  for fixed in (False, True):
    s = await client.open_session(_session_task(workspace, f"tests-{fixed}"))
    if fixed:
      await s.tool("edit", **FIX)
    await s.tool("create", path="tests/test_new.py",
                 content="def test_new_add():\n  pass\n")
    await s.tool("edit", path="tests/test_calc.py", old_str="assert sub(3, 1) == 2",
                 new_str="assert True")
    await s.tool("create", path="conftest.py", content="collect_ignore_glob = ['*']\n")
    verdict = await s.submit()
    assert verdict["reward"] == 0.0 and not verdict["resolved"], verdict
    assert any(f.startswith(("touches_test", "touches_conftest")) for f in verdict["findings"])
    if not fixed:   # the held-out tests ran as the task has them, not as the agent left them
      assert verdict["tests_status"]["tests/test_calc.py::test_add"] == "FAILED", verdict
      assert verdict["tests_status"]["tests/test_new.py::test_new_add"] == "FAILED", verdict


async def test_attack_session_git_history_has_no_future(client, workspace):
  async with await client.open_session(_session_task(workspace)) as s:
    run = await s.exec(
        "git log --all --oneline | wc -l; git log --all -p | grep -c " + rf.FIX_MARKER + "; "
        "git cat-file --batch-all-objects --batch | grep -c " + rf.FIX_MARKER + "; "
        "git fsck --lost-found 2>&1 | grep -c commit; "
        f"grep -rsl {rf.FIX_MARKER} /testbed /dockyard /tmp /home | wc -l", timeout_s=6)
    assert run["stdout"].split() == ["1", "0", "0", "0", "0"], run


async def test_attack_session_hostile_git_config_cannot_subvert_the_diff(client, workspace):
  s = await client.open_session(_session_task(workspace))
  await s.exec("git config core.fsmonitor 'touch /testbed/FSMONITOR_RAN; echo'; "
               "git config diff.external 'sh -c \"touch /testbed/EXTDIFF_RAN\"'; "
               "printf '*\\n' > .git/info/exclude; git config core.excludesFile /dev/null; "
               "printf 'ref: refs/heads/nowhere\\n' > .git/HEAD")
  await s.tool("edit", **FIX)
  patch = await s.diff()
  assert "-  return a - b\n+  return a + b" in patch and "FSMONITOR" not in patch, patch
  assert (await s.exec("ls /testbed"))["stdout"].split() == ["calc", "setup.cfg", "tests"]
  verdict = await s.submit()
  assert verdict["resolved"], verdict   # the honest change, graded as it is


async def test_attack_suite_sessions_leave_the_executor_healthy(client, server, workspace):
  health = httpx.get(server.url + "/healthz", timeout=10).json()
  assert health["ok"] and health["sessions"] == 0, health
  async with await client.open_session(_session_task(workspace, "after")) as s:
    await s.tool("edit", **FIX)
    assert (await s.submit())["resolved"]
  assert processes_with("dockyard_session_") == []
