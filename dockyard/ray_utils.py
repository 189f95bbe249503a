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
    ray.init(num_cpus=num_cpus or max(os.cpu_count() or 1, 2), **kwargs)
  return ray


# Fleet roles (issue 20 item 1). A node declares its role in $DOCKYARD_FLEET_ROLE before it joins
# Ray and advertises the custom resource `fleet_<role>: 1` (launch/slurm/ray.sub, launch/k8s);
# an actor asks for a fraction of it (e.g. 0.001) to land on a node of that role. The runtime does
# not place by role yet: these names are what the launch files write and what placement will read.
FLEET_ROLE_ENV = "DOCKYARD_FLEET_ROLE"
FLEET_ROLES = ("trainer", "inference", "sandbox")


def fleet_resource(role: str) -> str:
  """The custom Ray resource a node of `role` advertises: `fleet_trainer`, ..."""
  if role not in FLEET_ROLES:
    raise ValueError(f"fleet role {role!r}: expected one of {', '.join(FLEET_ROLES)}")
  return f"fleet_{role}"
