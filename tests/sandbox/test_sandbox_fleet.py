"""The Ray sandbox fleet: executors as Ray actors in a SPREAD placement group, serving HTTP."""
import pytest

from dockyard.sandbox import synthetic as rf
from configs import swe
from dockyard.sandbox.client import SandboxClient
from dockyard.sandbox.fleet import start_local_fleet

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fleet(workspace):
  config = swe.get_config("tiny")
  config.sandbox.num_executors = 2
  config.sandbox.slots = 1
  # Other rooms' session fixtures (vLLM engine actors) may hold some of this Ray's CPUs.
  config.sandbox.cpus_per_executor = 0.25
  urls, handle = start_local_fleet(config, repos_dir=workspace["repos"],
                                   cache_dir=workspace["cache"])
  yield urls, handle
  handle.shutdown()   # Ray itself stays up: other rooms' session fixtures may still use it


@pytest.mark.asyncio(loop_scope="session")
async def test_local_fleet_grades_tasks(fleet, workspace):
  import ray
  from ray.util.placement_group import placement_group_table
  urls, handle = fleet
  assert len(urls) == 2 and all(u.startswith("http://127.0.0.1:") for u in urls)
  assert len(set(urls)) == 2
  assert placement_group_table(handle.placement_group)["strategy"] == "SPREAD"
  tasks = [rf.task(workspace["base"], rf.gold_patch(), instance_id=f"fleet-{i}") for i in range(4)]
  async with SandboxClient(urls, request_timeout_s=120) as client:
    verdicts = await client.run_many(tasks)
  assert all(v["resolved"] for v in verdicts), [v["reason"] for v in verdicts]
  assert ray.is_initialized()


def test_two_executors_asked_for_one_port_on_one_host_both_serve(tmp_path):
  """The simulated-cluster case: both nodes share an IP and the configured port. The port is
  bound before uvicorn starts, so the second executor takes another port instead of failing."""
  import json
  import urllib.request

  from dockyard.sandbox.fleet import _ExecutorServer
  from dockyard.sandbox.local import free_port
  port = free_port()
  servers = [_ExecutorServer("127.0.0.1", port, 1, 4, {}, str(tmp_path), None) for _ in range(2)]
  try:
    urls = [s.url() for s in servers]
    assert urls[0] == f"http://127.0.0.1:{port}" and urls[1] != urls[0]
    assert all(json.load(urllib.request.urlopen(u + "/healthz", timeout=30)).get("ok") for u in urls)
  finally:
    for s in servers:
      s.stop()


def _children(pid: int) -> list[tuple[int, str]]:
  """(pid, name) of the live processes whose parent is `pid`."""
  import os
  out = []
  for p in os.listdir("/proc"):
    try:
      with open(f"/proc/{p}/stat") as f:
        stat = f.read()
    except OSError:
      continue
    name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
    if int(rest[1]) == pid and rest[0] != "Z":
      out.append((int(p), name))
  return out


def test_stop_does_not_wait_for_a_long_poll_or_a_running_verdict(workspace):
  """A run's end stops its executors while a client may still hold a /task/wait long-poll and
  verdicts may still run (groups an async collector generated ahead): the stop takes its grace
  and then cancels them, killing the running sandbox, instead of serving them out. The executor
  runs in a fresh interpreter, as in its Ray actor: this test process holds torch / JAX / Ray
  threads by now, and a sandbox forked from it crashed in the pre-check (SIGSEGV in a fork)."""
  import json
  import os
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  code = ("import json, sys; from tests.sandbox.test_sandbox_fleet import _stop_scenario; "
          "print(json.dumps(_stop_scenario(sys.argv[1], sys.argv[2])))")
  proc = subprocess.run([sys.executable, "-c", code, workspace["base"], workspace["repos"]], cwd=root,
                        env={**os.environ, "PYTHONPATH": root}, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out["took"] < 8, f"stop took {out['took']:.1f} s"
  assert out["left"] == [], f"sandboxes left running after the stop: {out['left']}"


def _stop_scenario(base: str, repos: str) -> dict:
  """In this (fresh) process: an executor with one slot, 3 verdicts that each sleep 60 s and a
  long-poll on them; once the first sandbox runs, stop. Returns the stop's seconds and the
  sandbox processes (children of this process) still alive 10 s later."""
  import json
  import os
  import tempfile
  import threading
  import time
  import urllib.request

  from dockyard.sandbox.fleet import _ExecutorServer
  slow = rf.src_patch(rf.CORE_FIXED + "\n\nimport time\ntime.sleep(60)\n")
  server = _ExecutorServer("127.0.0.1", 0, 1, 8, {"timeout_s": 120}, repos, tempfile.mkdtemp())
  url = server.url()

  def post(path, body, timeout=90):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
      return json.load(r)

  ids = post("/task/submit", [rf.task(base, slow, instance_id=f"stop-{i}") for i in range(3)])["ids"]
  threading.Thread(target=lambda: _swallow(lambda: post("/task/wait", {"ids": ids, "timeout": 60})),
                   daemon=True).start()
  deadline = time.monotonic() + 120
  while not any(n == "bwrap" for _, n in _children(os.getpid())):   # the first verdict's sandbox runs
    if time.monotonic() > deadline:
      raise RuntimeError(f"no sandbox started; children: {_children(os.getpid())}")
    time.sleep(0.1)
  t0 = time.monotonic()
  server.stop()
  took = time.monotonic() - t0
  deadline = time.monotonic() + 10
  while [c for c in _children(os.getpid()) if c[1] in ("bwrap", "nsenter")] and time.monotonic() < deadline:
    time.sleep(0.1)
  return dict(took=took, left=[c for c in _children(os.getpid()) if c[1] in ("bwrap", "nsenter")])


def _swallow(f):
  try:
    f()
  except Exception:
    pass
