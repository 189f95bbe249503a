"""The HTTP server and the client against real executor servers: the API, malformed requests,
back-pressure, 500 tasks in flight, and an executor killed mid-batch."""
import asyncio
import json

import httpx
import pytest

from dockyard.sandbox import synthetic as rf
from dockyard.sandbox.client import SandboxClient
from dockyard.sandbox.local import start_local_executor
from dockyard.sandbox.server import make_app

pytestmark = pytest.mark.asyncio(loop_scope="session")


def _rss_mb(pid: int) -> float:
  with open(f"/proc/{pid}/status") as f:
    line = next(l for l in f if l.startswith("VmRSS:"))
  return int(line.split()[1]) / 1024


def _metric(url: str, name: str) -> float:
  text = httpx.get(url + "/metrics").text
  line = next(l for l in text.splitlines() if l.startswith(f"dockyard_sandbox_{name} "))
  return float(line.split()[1])


async def test_submit_wait_and_get(server, workspace):
  async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
    health = (await http.get("/healthz")).json()
    assert health["ok"] and health["slots"] == 2
    tasks = [rf.task(workspace["base"], rf.gold_patch(), instance_id="api-gold"),
             rf.task(workspace["base"], "", instance_id="api-empty")]
    ids = (await http.post("/task/submit", json=tasks)).json()["ids"]
    assert len(ids) == 2 and len(set(ids)) == 2
    waited = (await http.post("/task/wait", json={"ids": ids, "timeout": 60})).json()["tasks"]
    assert [t["status"] for t in waited] == ["done", "done"]
    assert waited[0]["verdict"]["resolved"] and waited[0]["verdict"]["instance_id"] == "api-gold"
    one = (await http.get(f"/task/{ids[1]}", params={"wait": 1})).json()
    assert one["verdict"]["reason"] == "empty patch"
    single = (await http.post("/task/submit", json=tasks[1])).json()["ids"]
    assert len(single) == 1
    assert "dockyard_sandbox_completed_total" in (await http.get("/metrics")).text


@pytest.mark.parametrize("body, status, message", [
    (b"{not json", 400, "body: not valid JSON"),
    (json.dumps({"instance_id": "x"}).encode(), 422, "repo: missing"),
    (json.dumps([]).encode(), 422, "empty list"),
    (json.dumps([rf.task("a" * 40, ""), dict(rf.task("a" * 40, ""), FAIL_TO_PASS=3)]).encode(),
     422, "task[1] FAIL_TO_PASS"),
])
async def test_malformed_submissions_name_the_problem(server, body, status, message):
  async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
    resp = await http.post("/task/submit", content=body)
    assert resp.status_code == status and message in resp.json()["error"], resp.text
    resp = await http.get("/task/nope")
    assert resp.status_code == 404 and "unknown" in resp.json()["error"]
    resp = await http.post("/task/wait", json={"ids": "x"})
    assert resp.status_code == 422 and "ids" in resp.json()["error"]


async def test_full_queue_answers_429(executor):
  # No lifespan here, so no workers drain the queue: the third task cannot fit.
  app = make_app(executor, queue_size=2)
  transport = httpx.ASGITransport(app=app)
  async with httpx.AsyncClient(transport=transport, base_url="http://sandbox") as http:
    task = rf.task("a" * 40, "")
    assert (await http.post("/task/submit", json=[task, task])).status_code == 200
    resp = await http.post("/task/submit", json=task)
    assert resp.status_code == 429 and "queue full" in resp.json()["error"]
    metrics = (await http.get("/metrics")).text
    assert "dockyard_sandbox_rejected_total 1" in metrics
    assert "dockyard_sandbox_queued 2" in metrics


async def test_client_runs_real_tasks_in_order(server, workspace):
  wrong = rf.src_patch(rf.CORE_BUGGY.replace("a - b\n\n\ndef sub", "0\n\n\ndef sub"))
  tasks = [rf.task(workspace["base"], p, instance_id=f"client-{i}")
           for i, p in enumerate([rf.gold_patch(), wrong, rf.gold_patch()])]
  async with SandboxClient([server.url], request_timeout_s=120, max_in_flight=4) as client:
    verdicts = await client.run_many(tasks)
  assert [v["instance_id"] for v in verdicts] == ["client-0", "client-1", "client-2"]
  assert [v["resolved"] for v in verdicts] == [True, False, True]


async def test_client_rejects_bad_arguments():
  with pytest.raises(ValueError, match="urls"):
    SandboxClient([])
  with pytest.raises(ValueError, match="not an http"):
    SandboxClient(["localhost:9090"])
  with pytest.raises(ValueError, match="max_in_flight"):
    SandboxClient(["http://x"], max_in_flight=0)


async def test_500_in_flight_none_lost_or_duplicated(server, workspace):
  # Empty patches: each is a full trip through the queue and a worker, without a sandbox run.
  n = 500
  tasks = [rf.task(workspace["base"], "", instance_id=f"load-{i}") for i in range(n)]
  submitted = _metric(server.url, "submitted_total")
  rss_before = _rss_mb(server.process.pid)
  async with SandboxClient([server.url], request_timeout_s=120, max_in_flight=n,
                           wait_s=10) as client:
    verdicts = await client.run_many(tasks)
  assert [v["instance_id"] for v in verdicts] == [f"load-{i}" for i in range(n)]
  assert all(v["reason"] == "empty patch" for v in verdicts)
  assert _metric(server.url, "submitted_total") - submitted == n   # none resubmitted twice
  assert _rss_mb(server.process.pid) - rss_before < 150, "executor memory grew unbounded"


async def test_killing_an_executor_mid_batch_loses_nothing(workspace, tmp_path):
  a = start_local_executor(slots=1, repos_dir=workspace["repos"], cache_dir=workspace["cache"])
  b = start_local_executor(slots=1, repos_dir=workspace["repos"], cache_dir=workspace["cache"])
  try:
    # Each run takes >= 1 s (the fix sleeps at import), so the batch of 6 on 2 one-slot executors
    # is still running when one is killed, however fast the machine.
    slow_fix = rf.src_patch(rf.CORE_FIXED + "\n\nimport time\ntime.sleep(1.0)\n")
    tasks = [rf.task(workspace["base"], slow_fix, instance_id=f"fo-{i}") for i in range(6)]
    async with SandboxClient([a.url, b.url], request_timeout_s=180, max_in_flight=6,
                             wait_s=5) as client:
      batch = asyncio.ensure_future(client.run_many(tasks))
      await asyncio.sleep(1.5)
      assert not batch.done()
      a.kill()
      verdicts = await batch
      assert client.resubmissions >= 1
    assert [v["instance_id"] for v in verdicts] == [f"fo-{i}" for i in range(6)]
    assert all(v["resolved"] for v in verdicts), [v["reason"] for v in verdicts]
  finally:
    a.kill()
    b.kill()


async def test_malformed_requests_are_4xx_not_500(server, workspace):
  async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
    deep = "[" * 200_000 + "]" * 200_000
    r = await http.post("/task/submit", content=deep)
    assert r.status_code == 400 and "nested too deeply" in r.json()["error"]
    r = await http.post("/task/wait", content='{"ids": ' + deep + "}")
    assert r.status_code == 400
    for ids in ([["a"]], [{"x": 1}], "abc", [1]):
      r = await http.post("/task/wait", json={"ids": ids})
      assert r.status_code == 422, (ids, r.text)
    r = await http.post("/task/wait", json={"ids": [], "timeout": "nan"})
    assert r.status_code == 422
    for bad in ("-p.py::t", "tests/" + "x" * 200_000 + ".py::t"):
      task = rf.task(workspace["base"], rf.gold_patch(), FAIL_TO_PASS=[bad])
      r = await http.post("/task/submit", json=task)
      assert r.status_code == 422 and r.json()["error"].startswith("FAIL_TO_PASS"), r.text[:300]
    assert (await http.get("/healthz")).json()["ok"] is True


async def test_resolved_metric_counts_only_reward_one(server, workspace):
  # The agent's own copy of a held-out test: all tests pass, a finding zeroes it. The verdict
  # says resolved False, and the metric does not count it.
  before = _metric(server.url, "resolved_total")
  patch = rf.gold_patch() + rf.diff("tests/test_new.py", None, "def test_new_add():\n  pass\n")
  async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
    ids = (await http.post("/task/submit", json=rf.task(workspace["base"], patch))).json()["ids"]
    rec = (await http.post("/task/wait", json={"ids": ids, "timeout": 60})).json()["tasks"][0]
  v = rec["verdict"]
  assert v["reward"] == 0.0 and v["resolved"] is False and v["findings"], v
  assert _metric(server.url, "resolved_total") == before
