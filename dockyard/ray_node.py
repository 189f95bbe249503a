r"""Joins (or starts) a Ray cluster as a node of the fleet role in $DOCKYARD_FLEET_ROLE.

  DOCKYARD_FLEET_ROLE=inference python -m dockyard.ray_node -- --address=HEAD:6379 --block
  DOCKYARD_FLEET_ROLE=trainer python -m dockyard.ray_node -- --head --port=6379 --block
  python -m dockyard.ray_node --dry_run -- --head          # print the `ray start` line, run nothing

Reads the role, refuses a missing or unknown one, and execs `ray start` with the role's custom
resource (`dockyard.ray_utils.node_resources`) merged into any `--resources` given after `--`.
The runner's placement reads those resources (`ray_utils.role_bundle`); launch/slurm/ray.sub
starts every Ray node through this module.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys

from dockyard import ray_utils


def ray_start_command(role: str, ray_args: list[str]) -> list[str]:
  """`ray start <ray_args>` with `--resources` carrying the role's resource (merged, not replaced)."""
  resources = dict(ray_utils.node_resources(role))
  rest = []
  i = 0
  while i < len(ray_args):
    arg = ray_args[i]
    if arg == "--resources" or arg.startswith("--resources="):
      value = arg.split("=", 1)[1] if "=" in arg else (ray_args[i + 1] if i + 1 < len(ray_args) else "")
      i += 1 if "=" in arg else 2
      try:
        given = json.loads(value)
      except json.JSONDecodeError as e:
        raise ValueError(f"--resources={value!r} is not JSON: {e}") from None
      if not isinstance(given, dict):
        raise ValueError(f"--resources={value!r}: expected a JSON object")
      clash = [k for k in given if k.startswith("fleet_")]
      if clash:
        raise ValueError(f"--resources sets {clash}: the fleet role comes from "
                         f"{ray_utils.FLEET_ROLE_ENV} alone")
      resources.update(given)
      continue
    rest.append(arg)
    i += 1
  ray = shutil.which("ray") or os.path.join(os.path.dirname(sys.executable), "ray")
  return [ray, "start", *rest, f"--resources={json.dumps(resources, separators=(',', ':'))}"]


def main(argv: list[str] | None = None) -> None:
  argv = sys.argv[1:] if argv is None else argv
  ours, ray_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
  parser = argparse.ArgumentParser(prog="python -m dockyard.ray_node", description=__doc__.splitlines()[0])
  parser.add_argument("--dry_run", action="store_true", help="print the ray start line, run nothing")
  opts = parser.parse_args(ours)
  role = os.environ.get(ray_utils.FLEET_ROLE_ENV, "")
  if not role:
    parser.error(f"${ray_utils.FLEET_ROLE_ENV} is not set: expected one of {', '.join(ray_utils.FLEET_ROLES)}")
  try:
    cmd = ray_start_command(role, ray_args)
  except ValueError as e:
    parser.error(f"{ray_utils.FLEET_ROLE_ENV}={role!r}: {e}" if "fleet role" in str(e) else str(e))
  if opts.dry_run:
    print(shlex.join(cmd), flush=True)
    return
  os.execv(cmd[0], cmd)


if __name__ == "__main__":
  main()
