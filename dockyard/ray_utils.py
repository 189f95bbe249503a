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
