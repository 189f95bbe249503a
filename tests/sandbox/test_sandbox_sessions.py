"""Agent sessions against a real executor server: exec, file tools, diff, submit graded in a fresh
checkout, bad requests as 4xx, bounded output, timeouts, DELETE killing a running command, the
reaper, and a restart answering 410 while a verdict already returned stays readable."""
import asyncio

import httpx
import pytest

from dockyard.sandbox import synthetic as rf
from dockyard.sandbox.client import SandboxClient, SessionLost, SessionToolError
from dockyard.sandbox.local import free_port, start_local_executor
from dockyard.sandbox.sessions import SessionLimits
from tests.sandbox.session_helpers import FIX, processes_with

pytestmark = pytest.mark.asyncio(loop_scope="session")
async def test_session_exec_tools_and_submit_gold_resolves(server, workspace):
  task = rf.task(workspace["base"], "", instance_id="session-gold")
  async with SandboxClient([server.url]) as client:
    s = await client.open_session(task)
    run = await s.exec("ls tests; echo to-stderr >&2; git log --all --oneline | wc -l; exit 3")
    assert run["exit_code"] == 3 and not run["timed_out"]
    # base checkout: the held-out test file (test_patch) is not there, one commit of history
    assert run["stdout"].split() == ["__init__.py", "test_calc.py", "1"], run
    assert run["stderr"] == "to-stderr\n" and not run["stdout_truncated"]
    tests = await s.exec("python -m pytest -q -p no:cacheprovider tests", timeout_s=6)
    assert tests["exit_code"] == 0 and "1 passed" in tests["stdout"], tests
    edited = await s.tool("edit", **FIX)
    assert edited["first_line"] == 2 and "return a + b" in edited["output"]
    assert (await s.exec("cat calc/core.py"))["stdout"].startswith("def add(a, b):\n  return a + b")
    verdict = await s.submit()
    assert verdict["resolved"] and verdict["reward"] == 1.0, verdict
    assert verdict["instance_id"] == "session-gold" and verdict["patch_applied"]
    with pytest.raises(SessionLost, match="submitted; its verdict is task"):
      await s.exec("true")


async def test_file_tools_view_create_search_and_their_errors(server, workspace):
  async with SandboxClient([server.url]) as client:
    async with await client.open_session(rf.task(workspace["base"], "")) as s:
      part = await s.tool("view", path="calc/core.py", start=5, end=6)
      assert part["output"] == "     5\tdef sub(a, b):\n     6\t  return a - b"
      assert part["total_lines"] == 6
      assert "core.py" in (await s.tool("view", path="calc"))["output"]
      made = await s.tool("create", path="pkg/deep/new.py", content="X = 'it''s \"quoted\"'\n")
      assert "wrote pkg/deep/new.py" in made["output"]
      assert (await s.exec("python -c 'import pkg.deep.new as m; print(m.X)'"))["stdout"] == (
          'its "quoted"\n')
      found = await s.tool("search", pattern=r"def \w+\(a", regex=True)
      assert found["output"].splitlines() == ["calc/core.py:1:def add(a, b):",
                                              "calc/core.py:5:def sub(a, b):"]
      errors = {
          "occurs 2 times": ("edit", dict(path="calc/core.py", old_str="return a - b",
                                          new_str="x")),
          "not found in": ("edit", dict(path="calc/core.py", old_str="nope", new_str="x")),
          "already exists": ("create", dict(path="calc/core.py", content="")),
          "outside the checkout": ("view", dict(path="../../etc/passwd")),
          "no such file": ("view", dict(path="calc/missing.py")),
          "past the end": ("view", dict(path="calc/core.py", start=50)),
          "not a valid regular expression": ("search", dict(pattern="(", regex=True)),
          ".git directory": ("create", dict(path=".git/hooks/pre-commit", content="x")),
      }
      for message, (tool, args) in errors.items():
        with pytest.raises(SessionToolError, match=message):
          await s.tool(tool, **args)
      # the errors changed nothing
      assert (await s.diff()).count("diff --git") == 1   # pkg/deep/new.py only


async def test_bad_requests_are_4xx_naming_the_problem(server, workspace):
  async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
    sid = (await http.post("/session", json=rf.task(workspace["base"], ""))).json()["id"]
    cases = [
        (http.post("/session", content=b"{bad"), 400, "not valid JSON"),
        (http.post("/session", json={"instance_id": "x"}), 422, "repo: missing"),
        (http.post("/session", json=rf.task("b" * 40, "")), 422, "not a commit"),
        (http.post("/session/nope/exec", json={"command": "true"}), 404, "unknown"),
        (http.post(f"/session/{sid}/exec", json={"command": "x" * (65 << 10)}), 413, "bytes"),
        (http.post(f"/session/{sid}/exec", json={"command": ""}), 422, "command"),
        (http.post(f"/session/{sid}/exec", json={"command": "true", "timeout": 0}), 422,
         "timeout"),
        (http.post(f"/session/{sid}/exec", json={"command": "true", "timeout": 1e9}), 422,
         "timeout"),
        (http.post(f"/session/{sid}/exec", json={"command": "true", "timeout": "5"}), 422,
         "timeout"),
        (http.post(f"/session/{sid}/exec", json={"command": "true", "cwd": "/"}), 422,
         "unknown fields"),
        (http.post(f"/session/{sid}/exec", json=["true"]), 422, "JSON object"),
        (http.post(f"/session/{sid}/tools/rm", json={}), 404, "tool 'rm'"),
        (http.post(f"/session/{sid}/submit", json={"wait": -1}), 422, "wait"),
    ]
    for request, status, message in cases:
      resp = await request
      assert resp.status_code == status and message in resp.json()["error"], (message, resp.text)
    assert (await http.get(f"/session/{sid}")).json()["commands"] == 0   # none of them ran
    assert (await http.delete(f"/session/{sid}")).json()["deleted"]
    resp = await http.delete(f"/session/{sid}")
    assert resp.status_code == 410 and "deleted" in resp.json()["error"]


async def test_output_is_bounded_and_a_timeout_kills_the_command(server, workspace):
  marker = "dockyard_session_timeout_probe_4242"
  async with SandboxClient([server.url]) as client:
    async with await client.open_session(rf.task(workspace["base"], "")) as s:
      big = await s.exec("head -c 3000000 /dev/zero | tr '\\0' x; head -c 200000 /dev/zero >&2")
      assert big["exit_code"] == 0 and big["stdout_truncated"] and big["stderr_truncated"]
      assert big["stdout_bytes"] == 3000000 and big["stderr_bytes"] == 200000
      assert len(big["stdout"]) < 70000
      slow = await s.exec(f"exec -a {marker} sleep 1000", timeout_s=1)
      assert slow["timed_out"] and slow["exit_code"] is None
      assert processes_with(marker) == []
      assert (await s.exec("echo still here"))["stdout"] == "still here\n"


async def test_delete_kills_a_running_command(server, workspace):
  marker = "dockyard_session_delete_probe_4243"
  async with SandboxClient([server.url]) as client:
    s = await client.open_session(rf.task(workspace["base"], ""))
    running = asyncio.ensure_future(s.exec(f"exec -a {marker} sleep 1000", timeout_s=6))
    for _ in range(200):
      if processes_with(marker):
        break
      await asyncio.sleep(0.05)
    assert processes_with(marker), "the command never started"
    await s.close()
    with pytest.raises(SessionLost, match="deleted"):
      await running
    assert processes_with(marker) == []


async def test_reaper_restart_and_verdicts_kept(workspace, tmp_path):
  port = free_port()
  kw = dict(slots=1, repos_dir=workspace["repos"], cache_dir=workspace["cache"], port=port,
            limits={"timeout_s": 6.0}, log_path=str(tmp_path / "server.log"))
  handle = start_local_executor(sessions={"idle_s": 1.0, "lifetime_s": 600, "max_sessions": 1},
                                **kw)
  try:
    async with SandboxClient([handle.url], retry_attempts=2) as client:
      idle = await client.open_session(rf.task(workspace["base"], ""))
      for _ in range(300):   # the reaper runs every 0.25 s here; the machine may be loaded
        resp = httpx.get(f"{handle.url}/session/{idle.id}")
        if resp.status_code == 410:
          break
        await asyncio.sleep(0.1)
      assert resp.status_code == 410 and "idle" in resp.json()["error"], resp.text
      with pytest.raises(SessionLost, match="reaped: idle"):
        await idle.exec("true")
      done = await client.open_session(rf.task(workspace["base"], "", instance_id="kept"))
      await done.tool("edit", **FIX)
      verdict = await done.submit()
      assert verdict["resolved"], verdict
      task_id = httpx.get(f"{handle.url}/session/{done.id}").json()["error"].split("task ")[1][:32]
      record = httpx.get(f"{handle.url}/task/{task_id}").json()
      assert record["verdict"] == verdict   # stored like any verdict, the session long gone
      live = await client.open_session(rf.task(workspace["base"], ""))
      full = httpx.post(f"{handle.url}/session", json=rf.task(workspace["base"], ""))
      assert full.status_code == 429 and "session limit" in full.json()["error"], full.text
      handle.kill()
      handle = start_local_executor(sessions={"idle_s": 600}, **kw)
      with pytest.raises(SessionLost, match="executor restarted"):
        await live.exec("true")
      resp = httpx.get(f"{handle.url}/session/nope")   # no boot id: never an id of this executor
      assert resp.status_code == 404 and "unknown" in resp.json()["error"]
      assert httpx.get(f"{handle.url}/healthz").json()["sessions"] == 0
  finally:
    handle.kill()


async def test_open_session_fails_over_to_a_live_executor(server, workspace):
  dead = f"http://127.0.0.1:{free_port()}"
  async with SandboxClient([dead, server.url], retry_attempts=1, connect_timeout_s=1) as client:
    for _ in range(3):
      async with await client.open_session(rf.task(workspace["base"], "")) as s:
        assert s.url == server.url
        assert (await s.exec("echo ok"))["stdout"] == "ok\n"


async def test_session_limits_reject_bad_values():
  for field in ("max_sessions", "idle_s", "lifetime_s", "max_command_bytes"):
    with pytest.raises(ValueError, match=field):
      SessionLimits(**{field: 0})


async def test_a_submitted_diff_is_regraded_elsewhere_when_its_executor_dies(workspace, tmp_path):
  kw = dict(slots=1, repos_dir=workspace["repos"], cache_dir=workspace["cache"],
            limits={"timeout_s": 6.0})
  handles = [start_local_executor(log_path=str(tmp_path / f"s{i}.log"), **kw) for i in range(2)]
  try:
    async with SandboxClient([h.url for h in handles], retry_attempts=2,
                             connect_timeout_s=1) as client:
      s = await client.open_session(rf.task(workspace["base"], "", instance_id="failover"))
      await s.tool("edit", **FIX)
      pinned = next(h for h in handles if h.url == s.url)
      request = client._request

      async def kill_before_polling(method, url, **kw):
        if method == "GET" and "/task/" in url and pinned.process.poll() is None:
          pinned.kill()   # the executor grading this session's diff goes away
        return await request(method, url, **kw)

      client._request = kill_before_polling
      verdict = await s.submit()
      assert verdict["resolved"] and verdict["instance_id"] == "failover", verdict
      assert client.resubmissions >= 1
  finally:
    for h in handles:
      h.kill()
