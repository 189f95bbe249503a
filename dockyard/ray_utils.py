"""Starting or joining Ray, once per process, for the rollout and sandbox fleets (never the trainer)."""
from __future__ import annotations

import os


def init_ray(address: str = "", num_cpus: int | None = None):
  """Joins `address` if given, else starts a local Ray. Idempotent: a second call is a no-op."""
  import ray
  if ray.is_initialized():
    return ray
  os.environ.setdefault("RAY_DEDUP_LOGS", "0")
  kwargs = dict(include_dashboard=False, log_to_driver=True, ignore_reinit_error=True)
  if address:
    ray.init(address=address, **kwargs)
  else:
    # 'local': a new Ray of this process's own, even where `ray start` left a cluster on this machine
    # (a plain ray.init() would join that one)
    ray.init(address="local", num_cpus=num_cpus or max(os.cpu_count() or 1, 2), **kwargs)
  return ray


# Fleet roles. A node declares its role in $DOCKYARD_FLEET_ROLE before it joins Ray; the bootstrap
# (`python -m dockyard.ray_node`, which launch/slurm/ray.sub runs; KubeRay passes the same resource
# in rayStartParams, launch/k8s) makes it advertise the custom resource `fleet_<role>: 1`. When the
# connected cluster advertises any role, every fleet bundle asks for ROLE_SHARE of its role's
# resource (`role_bundle`), so engines land on inference nodes and executors on sandbox nodes, and
# the driver (the trainer) must sit on a trainer node (`check_driver_node`). A cluster that
# advertises no role (a local Ray, a laptop) places by CPU/GPU alone, as before.
FLEET_ROLE_ENV = "DOCKYARD_FLEET_ROLE"
FLEET_ROLES = ("trainer", "inference", "sandbox")
ROLE_SHARE = 0.001   # of a node's `fleet_<role>: 1` per bundle: up to 1000 bundles a node


def fleet_resource(role: str) -> str:
  """The custom Ray resource a node of `role` advertises: `fleet_trainer`, ..."""
  if role not in FLEET_ROLES:
    raise ValueError(f"fleet role {role!r}: expected one of {', '.join(FLEET_ROLES)}")
  return f"fleet_{role}"


def node_resources(role: str) -> dict[str, float]:
  """The custom resources a node of `role` advertises (the bootstrap's `ray start --resources`)."""
  return {fleet_resource(role): 1.0}


def advertised_roles(ray) -> set[str]:
  """The roles that some alive node of the connected cluster advertises (empty: no roles)."""
  resources = ray.cluster_resources()
  return {role for role in FLEET_ROLES if resources.get(fleet_resource(role), 0) > 0}


def role_bundle(ray, role: str, bundle: dict) -> dict:
  """`bundle` plus ROLE_SHARE of `fleet_<role>` when the cluster advertises roles; else `bundle`.

  Raises when the cluster advertises roles but no node of `role` has joined: its placement group
  would wait forever otherwise."""
  roles = advertised_roles(ray)
  if not roles:
    return dict(bundle)
  if role not in roles:
    raise RuntimeError(
        f"the Ray cluster advertises fleet roles {sorted(roles)} but no {role} node "
        f"(resource {fleet_resource(role)}): start one with {FLEET_ROLE_ENV}={role} "
        f"python -m dockyard.ray_node -- --address=HEAD:PORT, or wait until it has joined")
  return {**bundle, fleet_resource(role): ROLE_SHARE}


def check_driver_node(ray) -> str | None:
  """Where roles are advertised, the driver (it holds the trainer) must run on a trainer node.

  Returns the driver's role (None on a cluster without roles); raises naming the node otherwise."""
  if not advertised_roles(ray):
    return None
  node_id = ray.get_runtime_context().get_node_id()
  node = next((n for n in ray.nodes() if n["NodeID"] == node_id), None)
  resources = (node or {}).get("Resources", {})
  roles = [role for role in FLEET_ROLES if resources.get(fleet_resource(role), 0) > 0]
  if "trainer" not in roles:
    raise RuntimeError(
        f"this process (the trainer) is attached to Ray node {node_id} with roles {roles or 'none'}; "
        f"the cluster advertises fleet roles, so run it on a trainer node ({FLEET_ROLE_ENV}=trainer)")
  return "trainer"


def role_cluster(roles, num_cpus: int = 1):
  """A simulated cluster on this machine (`ray.cluster_utils.Cluster`, one raylet per node): a
  trainer head (1 CPU) and one node of `num_cpus` CPUs per entry of `roles`, each advertising its
  role's resource. Returns (cluster, {role: [node ids]}); nothing is connected to it yet
  (`cluster.address`), and the caller shuts it down. For tests and benches of placement."""
  from ray.cluster_utils import Cluster
  cluster = Cluster(initialize_head=True, connect=False, head_node_args=dict(
      num_cpus=1, resources=node_resources("trainer"), include_dashboard=False))
  nodes = {"trainer": [cluster.head_node.node_id]}
  for role in roles:
    nodes.setdefault(role, []).append(cluster.add_node(num_cpus=num_cpus, resources=node_resources(role)).node_id)
  cluster.wait_for_nodes()
  return cluster, nodes
