"""The files a build writes from its per-package results, and the repos they name.

`write_outputs`: train/validation/test.jsonl by package split, `tiny/train.jsonl` (`pick_tiny`)
and `manifest.json` (pins, pristine commits, counts, the validator) under `Options.out`; the
machine-dependent test timings go to the work dir. `setup_repos`: every repo and base commit the
written task files name, rebuilt from the pins.
"""
from __future__ import annotations

import collections
import dataclasses
import glob
import json
import os
import random
from typing import Any

from dockyard.data import repos, swe
from dockyard.data.swe_tasks.options import Options
from dockyard.data.swe_tasks.package import log

BUILDER = "python -m dockyard.data.build_swe_tasks"
TINY_MAX_FUNC_LINES = 15
TINY_MAX_TESTS = 120


def pick_tiny(tasks: list[dict], size: int, seed: int) -> list[dict]:
  """≈`size` small tasks, round-robin over packages: a short function, one test file, few tests."""
  small = [t for t in tasks if t["meta"]["func_lines"] <= TINY_MAX_FUNC_LINES and len(t["meta"]["test_files"]) == 1
           and len(t["FAIL_TO_PASS"]) + len(t["PASS_TO_PASS"]) <= TINY_MAX_TESTS]
  by_pkg = collections.defaultdict(list)
  for t in sorted(small, key=lambda t: t["instance_id"]):
    by_pkg[t["meta"]["package"]].append(t)
  rng = random.Random(f"{seed}:tiny")
  for v in by_pkg.values():
    rng.shuffle(v)
  out = []
  while len(out) < size and any(by_pkg.values()):
    for p in sorted(by_pkg):
      if by_pkg[p] and len(out) < size:
        out.append(by_pkg[p].pop())
  return sorted(out, key=lambda t: t["instance_id"])


def write_outputs(opts: Options, packages: list[repos.Package], results: dict[str, Any]) -> None:
  splits = collections.defaultdict(list)
  for pkg in packages:
    if pkg.name in results:
      splits[pkg.split] += results[pkg.name]["tasks"]
  for name in ("train", "validation", "test"):
    tasks = sorted(splits[name], key=lambda t: t["instance_id"])
    swe.write_jsonl(os.path.join(opts.out, f"{name}.jsonl"), tasks)
  tiny = pick_tiny(splits["train"], opts.tiny_size, opts.seed)
  swe.write_jsonl(os.path.join(opts.out, "tiny", "train.jsonl"), tiny)
  manifest = dict(
      description="dockyard's offline SWE task set: SWE-smith style mutations of pinned PyPI sdists",
      builder=BUILDER, seed=opts.seed,
      options=dict(max_candidates=opts.max_candidates, max_kept=opts.max_kept, runs=opts.runs,
                   timeout_s=opts.timeout_s, tiny_size=opts.tiny_size),
      validator=dict(
          name="direct-3x3",
          how=("dockyard.data.direct_runner (pytest in a temp tree, not isolated): empty patch fails every "
               "FAIL_TO_PASS and passes every PASS_TO_PASS test 3/3; the gold-patched tree (checked identical "
               "to the pristine tree) passes all listed tests 3/3 (3 shared pristine runs per test-file set); "
               "flaky tests (differing over 3 baseline runs) never listed"),
          sandbox=("run separately, not recorded here: `python -m dockyard.data.validate_swe` checks "
                   "gold resolves and empty fails through dockyard.sandbox")),
      git=dict(identity=repos.GIT_IDENTITY, pristine_tag=repos.PRISTINE_TAG,
               task_ref="refs/tags/<instance_id>", repos_dir="$DOCKYARD_REPOS_DIR or ~/.cache/dockyard/repos"),
      packages=[dataclasses.asdict(p) for p in packages],
      pristine_commits={p.repo: results[p.name]["pristine_commit"] for p in packages if p.name in results},
      counts={p.name: dict(split=p.split, candidates=results[p.name]["candidates"], kept=results[p.name]["kept"],
                           dropped=results[p.name]["dropped"], flaky_tests=len(results[p.name]["flaky_tests"]))
              for p in packages if p.name in results},
      totals=dict(candidates=sum(r["candidates"] for r in results.values()),
                  kept=sum(r["kept"] for r in results.values()),
                  splits={k: len(v) for k, v in sorted(splits.items())}, tiny=len(tiny)),
  )
  with open(os.path.join(opts.out, "manifest.json"), "w") as f:
    json.dump(manifest, f, indent=1, sort_keys=True)
    f.write("\n")
  # Timings vary by machine: kept out of the reproducible files.
  with open(os.path.join(opts.work_dir, "timings.json"), "w") as f:
    json.dump({k: r.get("test_seconds", {}) for k, r in results.items()}, f, indent=1)
  log(f"wrote {opts.out}: {manifest['totals']}")


def setup_repos(out: str, repos_dir: str = "") -> dict[str, str]:
  """Fetches the pinned sdists (`<out>/manifest.json`) and makes every repo + base commit that the
  task files under `out` name; `repos_dir` empty: `repos.default_repos_dir()`."""
  repos_dir = repos_dir or repos.default_repos_dir()
  tasks = []
  for path in sorted(glob.glob(os.path.join(out, "*.jsonl"))):
    tasks += [t.to_dict() for t in swe.load_tasks(path)]
  paths = repos.ensure_repos(os.path.join(out, "manifest.json"), tasks, repos_dir)
  log(f"{len(paths)} repos with {len(tasks)} task commits under {repos_dir}")
  return paths
