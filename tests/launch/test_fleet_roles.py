"""Fleet roles: the node bootstrap (`python -m dockyard.ray_node`) and placement by role on a
simulated multi-node Ray cluster (`ray.cluster_utils.Cluster`: one raylet per node, one machine).

The cluster probe runs in a child process (`python tests/launch/test_fleet_roles.py probe`) so
its Ray session cannot meet the local Ray that other tests' session fixtures share."""
import json
import os
import subprocess
import sys

import pytest

from dockyard import ray_node, ray_utils

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bootstrap_adds_the_role_resource_to_ray_start():
  cmd = ray_node.ray_start_command("inference", ["--address=h:6379", "--resources", '{"x": 2}', "--block"])
  assert os.path.basename(cmd[0]) == "ray" and cmd[1] == "start"
  assert cmd[2:4] == ["--address=h:6379", "--block"]
  assert json.loads(cmd[4].split("=", 1)[1]) == {"fleet_inference": 1.0, "x": 2}
  cmd = ray_node.ray_start_command("trainer", ["--head"])
  assert json.loads(cmd[-1].split("=", 1)[1]) == {"fleet_trainer": 1.0}


def _bootstrap(env_role, *args):
  env = {k: v for k, v in os.environ.items() if k != ray_utils.FLEET_ROLE_ENV}
  if env_role is not None:
    env[ray_utils.FLEET_ROLE_ENV] = env_role
  return subprocess.run([sys.executable, "-m", "dockyard.ray_node", *args], env=env, cwd=REPO,
                        capture_output=True, text=True, timeout=60)


def test_bootstrap_dry_run_and_bad_roles():
  r = _bootstrap("sandbox", "--dry_run", "--", "--address=n0:6379", "--block")
  assert r.returncode == 0, r.stderr
  assert r.stdout.strip().endswith("start --address=n0:6379 --block '--resources={\"fleet_sandbox\":1.0}'")
  r = _bootstrap(None, "--dry_run", "--", "--head")
  assert r.returncode == 2 and "DOCKYARD_FLEET_ROLE is not set" in r.stderr
  r = _bootstrap("gpu", "--dry_run", "--", "--head")
  assert r.returncode == 2 and "fleet role 'gpu'" in r.stderr and "trainer, inference, sandbox" in r.stderr
  r = _bootstrap("trainer", "--dry_run", "--", "--head", '--resources={"fleet_sandbox": 1}')
  assert r.returncode == 2 and "fleet_sandbox" in r.stderr and "DOCKYARD_FLEET_ROLE alone" in r.stderr


class _FakeRay:
  """The two calls `role_bundle` / `check_driver_node` make, for the error paths only."""

  def __init__(self, cluster, nodes=(), me=""):
    self._cluster, self._nodes, self._me = cluster, list(nodes), me

  def cluster_resources(self):
    return self._cluster

  def nodes(self):
    return self._nodes

  def get_runtime_context(self):
    me = self._me

    class Ctx:
      def get_node_id(self):
        return me
    return Ctx()


def test_without_roles_placement_is_unchanged():
  ray = _FakeRay({"CPU": 8.0})
  assert ray_utils.role_bundle(ray, "inference", {"CPU": 1.0}) == {"CPU": 1.0}
  assert ray_utils.check_driver_node(ray) is None


def test_a_missing_role_or_a_driver_off_the_trainer_nodes_is_an_error():
  ray = _FakeRay({"CPU": 8.0, "fleet_trainer": 1.0, "fleet_sandbox": 2.0},
                 nodes=[{"NodeID": "a", "Resources": {"fleet_sandbox": 1.0}},
                        {"NodeID": "b", "Resources": {"fleet_trainer": 1.0}}], me="a")
  with pytest.raises(RuntimeError, match="no inference node .*fleet_inference"):
    ray_utils.role_bundle(ray, "inference", {"CPU": 1.0})
  assert ray_utils.role_bundle(ray, "sandbox", {"CPU": 1.0}) == {"CPU": 1.0, "fleet_sandbox": ray_utils.ROLE_SHARE}
  with pytest.raises(RuntimeError, match="node a with roles \\['sandbox'\\].*trainer node"):
    ray_utils.check_driver_node(ray)
  ray._me = "b"
  assert ray_utils.check_driver_node(ray) == "trainer"


def _probe() -> dict:
  """Starts a 4-node cluster (trainer head, 1 inference, 2 sandbox nodes), places an engine's
  placement group and a 2-executor sandbox fleet through the runtime's own code, and reports
  where each bundle landed."""
  import urllib.request

  import ray
  from ray.util.placement_group import placement_group_table

  from configs import swe
  from dockyard.rollout import fleet as rollout_fleet
  from dockyard.sandbox.fleet import start_local_fleet

  cluster, nodes = ray_utils.role_cluster(("inference", "sandbox", "sandbox"), num_cpus=2)
  try:
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    out = {"nodes": nodes, "driver_role": ray_utils.check_driver_node(ray)}
    pg = rollout_fleet._placement({"tensor_parallel_size": 2, "cpus_per_engine": 1.0}, on_gpu=False)
    ray.get(pg.ready(), timeout=60)
    out["engine_bundles"] = list(placement_group_table(pg)["bundles_to_node_id"].values())
    config = swe.get_config("tiny")
    config.run.ray_address = cluster.address
    config.sandbox.num_executors, config.sandbox.slots, config.sandbox.cpus_per_executor = 2, 1, 1.0
    urls, handle = start_local_fleet(config)
    try:
      table = placement_group_table(handle.placement_group)
      out["sandbox_strategy"] = table["strategy"]
      out["sandbox_bundles"] = list(table["bundles_to_node_id"].values())
      out["sandbox_health"] = [json.load(urllib.request.urlopen(u + "/healthz", timeout=30)) for u in urls]
    finally:
      handle.shutdown()
    return out
  finally:
    ray.shutdown()
    cluster.shutdown()


@pytest.mark.slow
def test_fleets_land_on_their_role_nodes_of_a_simulated_cluster():
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p),
             RAY_DEDUP_LOGS="0")
  r = subprocess.run([sys.executable, os.path.abspath(__file__), "probe"], env=env, cwd=REPO,
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  out = json.loads(r.stdout.strip().splitlines()[-1])
  nodes = out["nodes"]
  assert out["driver_role"] == "trainer"
  assert out["engine_bundles"] == nodes["inference"] * 2          # PACK: both TP ranks there
  assert out["sandbox_strategy"] == "SPREAD"
  assert sorted(out["sandbox_bundles"]) == sorted(nodes["sandbox"])  # one executor per sandbox node
  assert all(h.get("ok") for h in out["sandbox_health"]), out["sandbox_health"]


if __name__ == "__main__" and sys.argv[1:] == ["probe"]:
  print(json.dumps(_probe()), flush=True)
