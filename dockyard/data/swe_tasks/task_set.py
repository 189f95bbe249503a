"""`build`: every package of `Options.packages` through `PackageBuilder`, then the output files.

Each package's result is saved to `<work_dir>/<package>.json` as it finishes; a later build
reuses it (and only re-makes its repo) unless `Options.fresh`, so a stopped build resumes
package by package. `Options.only` builds just the named packages.
"""
from __future__ import annotations

import json
import os
from typing import Any

from dockyard.data import repos
from dockyard.data.swe_tasks import manifest
from dockyard.data.swe_tasks.options import Options
from dockyard.data.swe_tasks.package import PackageBuilder, log


def build(opts: Options) -> dict[str, Any]:
  """{package: its result (tasks, counts, pristine commit)}; writes the split files and the manifest."""
  opts = opts.resolved()
  os.makedirs(opts.work_dir, exist_ok=True)
  packages = repos.load_packages(opts.packages)
  if opts.only:
    unknown = set(opts.only) - {p.name for p in packages}
    if unknown:
      raise ValueError(f"Options.only names packages not in {opts.packages}: {sorted(unknown)}")
  results = {}
  for pkg in packages:
    state = os.path.join(opts.work_dir, f"{pkg.name}.json")
    if not opts.fresh and os.path.exists(state):
      with open(state) as f:
        results[pkg.name] = json.load(f)
      log(f"{pkg.name}: reusing {state} ({results[pkg.name]['kept']} tasks)")
      repos.ensure_repos([pkg], results[pkg.name]["tasks"], opts.repos_dir)
      continue
    if opts.only and pkg.name not in opts.only:
      continue
    work = os.path.join(opts.work_dir, pkg.name)
    os.makedirs(work, exist_ok=True)
    res = PackageBuilder(pkg, opts, work).build()
    with open(state + ".tmp", "w") as f:
      json.dump(res, f)
    os.replace(state + ".tmp", state)
    results[pkg.name] = res
    log(f"{pkg.name}: {res['kept']} kept of {res['candidates']} candidates; dropped {res['dropped']}")
  manifest.write_outputs(opts, packages, results)
  return results
