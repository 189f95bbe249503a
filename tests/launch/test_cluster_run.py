"""A short SWE run on a simulated Ray cluster of the three fleet roles, and the faults it survives.

`python tests/launch/test_cluster_run.py scenario WORKDIR` (what the test runs, in a child process,
so its Ray session cannot meet the local Ray that other tests' fixtures share) starts a 4-node
`ray.cluster_utils.Cluster` (one raylet per node, one machine): a trainer head, one inference node
and two sandbox nodes. Two sandbox nodes rather than one with two executors: the sandbox fleet
places one executor per sandbox node (SPREAD), as on a real cluster, so killing one executor is
losing that node's, and the client must fail over to the other node's.

The cluster lives in this scenario process; the run is the real launcher
(`python -m dockyard.launch --config=configs/swe.py:tiny --config.run.ray_address=...`) in a
grandchild process that only joins it, so killing the run leaves the cluster up. One run of 3 GRPO
steps (2 tasks x 4 samples, after a 60-step SFT warm start on those 2 tasks so that samples parse
and reach the sandbox), and during it:
  a. as soon as an executor reports a task running (its /healthz), that executor's process is
     SIGKILLed: the step must still score every sample (the client resubmits the lost task to the
     other executor);
  b. once step 1's metrics row is written, the engine's process is SIGKILLed: the fleet restarts it
     in its placement group on the inference node with the fleet's newest weights, and the next
     refit reports every engine at the trainer's weight version with the canary passing;
  c. as soon as step 2's checkpoint is written, the driver is SIGKILLed (before or after it writes
     step 2's metrics row), and the same command is run again on the same workdir and cluster: it
     resumes at step 2 (writing step 2's row from the checkpoint if it was lost) and finishes step 3. The relaunch
     adds `--config.rollout.data_plane=object_store` (issue 20 item 6): step 3's groups are
     generated and scored by the experience worker beside the engine, on the inference node, and
     reach the trainer through the object store.
Placement is read from Ray's own tables (actors, placement groups, jobs) while each run is up.
"""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 3
ENGINE, EXECUTOR, WORKER = "EngineActorImpl", "_ExecutorServer", "ExperienceWorkerImpl"
RUN_FLAGS = (
    "--config=configs/swe.py:tiny",
    f"--config.grpo.max_num_steps={STEPS}",
    "--config.grpo.num_prompts_per_step=2",
    "--config.grpo.num_generations_per_prompt=4",
    "--config.grpo.val_at_start=False",
    "--config.grpo.val_period=0",
    "--config.grpo.sft_warmup.steps=60",        # 2 tasks, batch 2: patches that parse (test_swe_e2e)
    "--config.grpo.sft_warmup.batch_size=2",
    "--config.checkpoint.save_period=1",
    "--config.sandbox.num_executors=2",
    "--config.sandbox.slots=1",
    "--config.rollout.max_model_len=1024",
    "--config.logging.tensorboard=False",
    "--config.logging.png_curve=False",
)


# -- the scenario (child process) -----------------------------------------------------------------

def _actors(ray_state, cls=None, alive=True) -> list[dict]:
  """Ray's actor table (GCS), as {id, cls, node, pid, pg, job, state}: the raw records, since the
  parsed ones (`ray._private.state.actors()`) leave out the placement group, and `ray.util.state`
  needs the dashboard."""
  from ray.core.generated import gcs_pb2
  out = []
  for raw in ray_state.state._connect_and_get_accessor().get_actor_table(None, None):
    a = gcs_pb2.ActorTableData.FromString(raw)
    row = dict(id=a.actor_id.hex(), cls=a.class_name, node=a.address.node_id.hex(), pid=a.pid,
               pg=a.placement_group_id.hex() or None, job=a.job_id.hex(),
               state=gcs_pb2.ActorTableData.ActorState.Name(a.state))
    if (cls is None or row["cls"] == cls) and (not alive or row["state"] == "ALIVE"):
      out.append(row)
  return out


def _wait(what: str, fn, proc, timeout: float, poll: float = 0.05):
  deadline = time.monotonic() + timeout
  while True:
    got = fn()
    if got:
      return got
    if proc is not None and proc.poll() is not None:
      raise RuntimeError(f"the run exited ({proc.returncode}) while waiting for {what}")
    if time.monotonic() > deadline:
      raise TimeoutError(f"no {what} within {timeout} s")
    time.sleep(poll)


def _step_rows(workdir: str) -> list[dict]:
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  rows = []
  for line in open(path).read().splitlines():
    try:
      row = json.loads(line)
    except json.JSONDecodeError:   # being written
      continue
    if "reward/raw_mean" in row:
      rows.append(row)
  return rows


def _checkpoint_step(workdir: str) -> int:
  try:
    with open(os.path.join(workdir, "checkpoints", "latest", "loop_state.json")) as f:
      return int(json.load(f)["step"])
  except (OSError, ValueError, KeyError):
    return 0


def _executor_url(pid: int) -> str | None:
  """The URL of the executor HTTP server that process `pid` listens on (it also listens for Ray)."""
  import psutil
  for conn in psutil.Process(pid).net_connections(kind="tcp"):
    if conn.status != psutil.CONN_LISTEN:
      continue
    url = f"http://{conn.laddr.ip}:{conn.laddr.port}"
    try:
      if "slots" in json.load(urllib.request.urlopen(url + "/healthz", timeout=2)):
        return url
    except Exception:   # Ray's gRPC ports
      continue
  return None


def _health(url: str) -> dict:
  try:
    return json.load(urllib.request.urlopen(url + "/healthz", timeout=2))
  except Exception:
    return {}


def _placement(ray_state, pgs, job=None) -> dict:
  """Where this run's engine and executors are: their actors' nodes and their groups' bundles."""
  def mine(rows):
    return [r for r in rows if job is None or r["job"] == job]
  engines, executors = mine(_actors(ray_state, ENGINE)), mine(_actors(ray_state, EXECUTOR))
  table = pgs()
  group = lambda r: table.get(r["pg"], {})
  return {"job": (engines or executors or [{}])[0].get("job"),
          "engine_nodes": [r["node"] for r in engines],
          "engine_bundle_nodes": [list(group(r).get("bundles_to_node_id", {}).values()) for r in engines],
          "engine_strategy": [group(r).get("strategy") for r in engines],
          "executor_nodes": sorted(r["node"] for r in executors),
          "executor_bundle_nodes": sorted({n for r in executors
                                           for n in group(r).get("bundles_to_node_id", {}).values()}),
          "executor_strategy": sorted({group(r).get("strategy") for r in executors} - {None})}


def _launch(workdir: str, address: str, n: int, *extra: str) -> subprocess.Popen:
  """The launcher joined to `address`; its terminal output goes to launch-<n>.out beside the workdir
  (everything after start-up is in the workdir's run.log too)."""
  env = dict(os.environ, PYTHONPATH=REPO, VLLM_CPU_KVCACHE_SPACE="1", TOKENIZERS_PARALLELISM="false")
  with open(os.path.join(os.path.dirname(workdir), f"launch-{n}.out"), "w") as out:
    return subprocess.Popen([sys.executable, "-m", "dockyard.launch", f"--workdir={workdir}", *RUN_FLAGS,
                             f"--config.data.train={os.path.join(os.path.dirname(workdir), 'train2.jsonl')}",
                             f"--config.run.ray_address={address}", *extra],
                            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


def _scenario(workdir: str) -> dict:
  import ray
  from ray._private import state as ray_state
  from ray.util import placement_group_table

  from dockyard import ray_utils

  with open(os.path.join(REPO, "data/swe/tiny/train.jsonl")) as f, \
       open(os.path.join(os.path.dirname(workdir), "train2.jsonl"), "w") as out:
    out.writelines(f.readlines()[:2])
  t0 = time.monotonic()
  cluster, nodes = ray_utils.role_cluster(("inference", "sandbox", "sandbox"))
  out = {"nodes": nodes, "address": cluster.address}
  procs = []
  try:
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    pgs = lambda: {pg: t for pg, t in placement_group_table().items() if t.get("state") == "CREATED"}
    proc = _launch(workdir, cluster.address, 1)
    procs.append(proc)
    out["driver_pid"] = proc.pid

    # Placement, once the run's engine and both executors are up.
    _wait("engine and 2 executors", lambda: len(_actors(ray_state, ENGINE)) == 1
          and len(_actors(ray_state, EXECUTOR)) == 2, proc, 300)
    out["run1"] = _placement(ray_state, pgs)
    out["run1"]["driver_node"] = _driver_node(ray_state, proc.pid)
    by_url = {_executor_url(r["pid"]): r for r in _actors(ray_state, EXECUTOR)}
    assert None not in by_url and len(by_url) == 2, by_url

    # a. An executor killed while it runs a task.
    def busy():
      return next((u for u in by_url if _health(u).get("running", 0) > 0), None)
    url = _wait("a task running on an executor", busy, proc, 300, poll=0.02)
    victim = by_url[url]
    os.kill(victim["pid"], signal.SIGKILL)
    out["executor_kill"] = {"url": url, "node": victim["node"], "step": len(_step_rows(workdir)) + 1,
                            "t": time.monotonic() - t0}

    # b. The engine killed between steps 1 and 2.
    _wait("step 1's metrics", lambda: len(_step_rows(workdir)) >= 1, proc, 300)
    engine = _actors(ray_state, ENGINE)[0]
    os.kill(engine["pid"], signal.SIGKILL)
    out["engine_kill"] = {"actor": engine["id"], "node": engine["node"], "pg": engine["pg"],
                          "after_step": len(_step_rows(workdir)), "t": time.monotonic() - t0}
    restarted = _wait("a restarted engine", lambda: [r for r in _actors(ray_state, ENGINE)
                                                     if r["id"] != engine["id"]], proc, 300)
    out["engine_restart"] = {"node": restarted[0]["node"], "pg": restarted[0]["pg"]}

    # c. The driver killed as soon as step 2's checkpoint is written (its metrics row may not be:
    # the resumed run writes it from the checkpoint then), then the same command again.
    _wait("step 2's checkpoint", lambda: _checkpoint_step(workdir) >= 2, proc, 300, poll=0.02)
    proc.send_signal(signal.SIGKILL)
    out["driver_kill"] = {"returncode": proc.wait(30), "checkpoint_step": _checkpoint_step(workdir),
                          "rows": len(_step_rows(workdir)), "t": time.monotonic() - t0}
    # The dead driver's actors go with its job; the relaunch places its own.
    _wait("the killed run's actors to be gone", lambda: not _actors(ray_state, ENGINE)
          and not _actors(ray_state, EXECUTOR), None, 120)
    proc = _launch(workdir, cluster.address, 2, "--config.rollout.data_plane=object_store")
    procs.append(proc)
    _wait("the resumed run's engine, 2 executors and experience worker", lambda: len(_actors(ray_state, ENGINE)) == 1
          and len(_actors(ray_state, EXECUTOR)) == 2 and len(_actors(ray_state, WORKER)) == 1, proc, 300)
    out["run2_worker_nodes"] = [r["node"] for r in _actors(ray_state, WORKER)]
    out["run2"] = _placement(ray_state, pgs)
    out["run2"]["driver_node"] = _driver_node(ray_state, proc.pid)
    out["run2"]["returncode"] = proc.wait(300)
    out["wall_s"] = time.monotonic() - t0
    return out
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait(30)
    ray.shutdown()
    cluster.shutdown()


def _driver_node(ray_state, pid: int) -> str | None:
  """The node of the live driver process `pid` (Ray's job table)."""
  from ray.core.generated import gcs_pb2
  for _ in range(100):
    for raw in ray_state.state._connect_and_get_accessor().get_job_table(
        skip_submission_job_info_field=True, skip_is_running_tasks_field=True):
      job = gcs_pb2.JobTableData.FromString(raw)
      if job.driver_pid == pid and not job.is_dead:
        return job.driver_address.node_id.hex()
    time.sleep(0.1)
  return None


# -- the test ----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_short_swe_run_on_a_simulated_cluster_survives_faults(tmp_path):
  workdir = str(tmp_path / "run")
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p),
             RAY_DEDUP_LOGS="0")
  r = subprocess.run([sys.executable, os.path.abspath(__file__), "scenario", workdir], env=env, cwd=REPO,
                     capture_output=True, text=True, timeout=840)
  def read(path):
    return open(path).read() if os.path.exists(path) else ""
  log = read(os.path.join(workdir, "run.log"))
  assert r.returncode == 0, (r.stderr[-3000:] + "\n--- launcher output ---\n"
                             + "".join(read(str(tmp_path / f"launch-{n}.out"))[-2000:] for n in (1, 2))
                             + "\n--- run.log ---\n" + log[-5000:])
  out = json.loads(r.stdout.strip().splitlines()[-1])
  nodes = out["nodes"]
  (trainer,), (inference,), sandbox = nodes["trainer"], nodes["inference"], sorted(nodes["sandbox"])

  # Placement, both runs: the engine (and its PACK group) on the inference node, one executor on
  # each sandbox node (SPREAD), the driver on the trainer node.
  for run in ("run1", "run2"):
    p = out[run]
    assert p["engine_nodes"] == [inference] and p["engine_bundle_nodes"] == [[inference]], p
    assert p["engine_strategy"] == ["PACK"], p
    assert p["executor_nodes"] == sandbox and p["executor_bundle_nodes"] == sandbox, p
    assert p["executor_strategy"] == ["SPREAD"], p
    assert p["driver_node"] == trainer, p
  assert out["run1"]["job"] != out["run2"]["job"]

  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl")) if line.strip()]
  steps = [row for row in rows if "reward/raw_mean" in row]
  by_step = {}
  for row in steps:   # a resumed run's record of a step replaces the killed run's
    by_step[row["step"]] = row

  # a. The executor was killed while it ran a task of step 1; the step scored every sample: its
  # row exists (a lost verdict fails the step), the client resubmitted to the other executor.
  kill = out["executor_kill"]
  assert kill["step"] == 1 and kill["node"] in sandbox, kill
  assert by_step[1]["reward/malformed_fraction"] < 1.0      # samples did reach the sandbox
  lost = [line for line in log.splitlines() if f"sandbox executor {kill['url']} lost task" in line]
  assert lost, "no failover logged for the killed executor"

  # b. The engine was killed after step 1; restarted in its placement group on the inference node;
  # the next refit found every engine at the trainer's version and the canary passed.
  kill = out["engine_kill"]
  assert kill["after_step"] == 1 and kill["node"] == inference, kill
  assert kill["pg"] and out["engine_restart"] == {"node": inference, "pg": kill["pg"]}
  restart = [line for line in log.splitlines() if "rollout engine 0 died; restarted it (restart 1)" in line]
  assert restart and restart[0].endswith(f"at weight version {int(by_step[1]['weight_version'])}"), restart
  two = by_step[2]
  assert two["refit/engine_restarts"] == 1.0
  assert two["refit/engine_version_min"] == two["weight_version"] == two["refit/version"]
  assert two["refit/canary/max_abs_logprob_delta"] <= 1e-3

  # c. The driver was killed (SIGKILL) after step 2's checkpoint and before step 3 ended; the same
  # command resumed at step 2 (no second SFT, no step 1 or 2 again) and finished step 3.
  kill = out["driver_kill"]
  assert kill["returncode"] == -signal.SIGKILL and kill["checkpoint_step"] == 2 and kill["rows"] in (1, 2), kill
  assert out["run2"]["returncode"] == 0
  assert [row["step"] for row in steps] == [1, 2, 3]
  sft = [row for row in rows if "sft/loss" in row]
  assert len(sft) == 60     # the warm start ran once, in the first run
  assert json.load(open(os.path.join(workdir, "checkpoints", "latest", "loop_state.json")))["step"] == STEPS

  # The relaunch ran on the data plane: its worker beside the engine on the inference node, step 3's
  # two groups read from the object store (steps 1-2, the first run's, had none).
  assert out["run2_worker_nodes"] == [inference]
  assert by_step[3]["data_plane/groups"] == 2.0 and by_step[3]["data_plane/shared_bytes"] > 0
  assert "data_plane/groups" not in by_step[2]
  assert by_step[3]["reward/malformed_fraction"] < 1.0      # the worker's samples reached the sandbox


if __name__ == "__main__" and sys.argv[1:2] == ["scenario"]:
  print(json.dumps(_scenario(os.path.abspath(sys.argv[2]))), flush=True)
