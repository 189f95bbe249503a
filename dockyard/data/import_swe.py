r"""Imports SWE-bench-format task records, attaching each task's test environment from a registry.

  python -m dockyard.data.import_swe --tasks swe_gym.jsonl --environments envs.json --out data/swe/mine.jsonl

`--tasks`: SWE-bench / SWE-Gym / SWE-smith / SWE-rebench records (.jsonl, .json list, or .parquet
with pyarrow), FAIL_TO_PASS / PASS_TO_PASS as lists or JSON-encoded strings; every record is
checked and an error names the file, line, task and missing key. Keys beyond the schema are kept
as they are. `--environments` (optional): a JSON object from `"owner/name@version"` or
`"owner/name"` to an environment spec (`dockyard.sandbox.environments`: python, pinned
requirements, pytest_args); a task takes the entry for its repo and version, else for its repo,
else keeps the `environment` it already has, else runs on the executor's own Python (listed in
the summary). The output is JSONL the runner (`env.code.*_tasks`) and `validate_swe` read.
The repositories must exist as `<repos_dir>/owner__name` (git, with each base_commit): the summary
names those that do not.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from typing import Any, Mapping, Sequence

from dockyard.data import repos, swe
from dockyard.sandbox.environments import EnvironmentSpecError, parse_spec


def load_registry(path: str) -> dict[str, dict[str, Any]]:
  """The environment registry: {"owner/name@version" or "owner/name": spec}, every spec checked."""
  with open(path) as f:
    try:
      data = json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}: not valid JSON ({e})") from None
  if not isinstance(data, Mapping):
    raise ValueError(f"{path}: expected an object from 'owner/name[@version]' to an environment spec")
  for key, spec in data.items():
    if not isinstance(key, str) or key.split("@", 1)[0].count("/") != 1:
      raise ValueError(f"{path}: key {key!r} is not 'owner/name' or 'owner/name@version'")
    try:
      parse_spec(spec)
    except EnvironmentSpecError as e:
      raise ValueError(f"{path}: {key}: {e}") from None
  return {k: dict(v) for k, v in data.items()}


def attach(tasks: Sequence[swe.SweTask], registry: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
  """Sets each task's environment from the registry; returns {instance_id: where it came from}."""
  source = {}
  for t in tasks:
    for key in (f"{t.repo}@{t.version}" if t.version else None, t.repo):
      if key is not None and key in registry:
        t.environment, source[t.instance_id] = dict(registry[key]), f"registry[{key!r}]"
        break
    else:
      source[t.instance_id] = "record" if t.environment is not None else "none"
  return source


def main(argv: Sequence[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--tasks", required=True, help="a .jsonl/.json/.parquet file of SWE-bench-format records")
  ap.add_argument("--environments", default="", help="the environment registry (JSON); optional")
  ap.add_argument("--out", required=True, help="the JSONL to write")
  ap.add_argument("--repos_dir", default="", help="where the task repositories live "
                  "(default: $DOCKYARD_REPOS_DIR or ~/.cache/dockyard/repos)")
  a = ap.parse_args(argv)
  try:
    tasks = swe.load_tasks(a.tasks)
    registry = load_registry(a.environments) if a.environments else {}
  except (ValueError, FileNotFoundError, ImportError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  source = attach(tasks, registry)
  n = swe.write_jsonl(a.out, tasks)
  repos_dir = a.repos_dir or repos.default_repos_dir()
  missing = sorted({t.repo for t in tasks
                    if not os.path.isdir(os.path.join(repos_dir, repos.repo_dirname(t.repo)))})
  extra = collections.Counter(k for t in tasks for k in t.extra)
  by_source = collections.Counter(v if v in ("record", "none") else "registry" for v in source.values())
  print(f"wrote {n} tasks to {a.out} ({len({t.repo for t in tasks})} repos)")
  print(f"environments: {by_source['registry']} from the registry, {by_source['record']} from the "
        f"records, {by_source['none']} with none (the executor's own Python)")
  if by_source["none"]:
    print("  without an environment: " + ", ".join(sorted({t.repo for t in tasks
                                                            if source[t.instance_id] == "none"})))
  if extra:
    print("kept unknown keys: " + ", ".join(f"{k} ({c})" for k, c in sorted(extra.items())))
  if missing:
    print(f"repositories not under {repos_dir} (clone them as owner__name before grading): "
          + ", ".join(missing))
  return 0


if __name__ == "__main__":
  sys.exit(main())
