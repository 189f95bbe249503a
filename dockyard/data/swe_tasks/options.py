"""`Options`: the settings of one task-set build, declared once.

Each field's default and `help` are the whole declaration: `dockyard.data.build_swe_tasks` makes
one absl flag per field from them (`--max_candidates=80`, `--only=inflection --only=...`,
`--fresh`), and code that builds programmatically passes the same fields.
"""
from __future__ import annotations

import dataclasses
import os

from dockyard.data import repos


def _opt(default, help_text: str):
  return dataclasses.field(default=default, metadata={"help": help_text})


@dataclasses.dataclass(frozen=True)
class Options:
  packages: str = _opt("data/swe/packages.json", "the pinned packages (name, version, sdist sha256, split)")
  out: str = _opt("data/swe", "where train/validation/test.jsonl, tiny/ and manifest.json go")
  seed: int = _opt(0, "seeds the candidate order and the tiny subset")
  repos_dir: str = _opt("", "the task git repos; empty: $DOCKYARD_REPOS_DIR or ~/.cache/dockyard/repos")
  work_dir: str = _opt("", "per-package build state (resumable); empty: "
                           "$DOCKYARD_CACHE/build_swe/seed<N>, DOCKYARD_CACHE defaulting to ~/.cache/dockyard")
  max_candidates: int = _opt(80, "mutations tried per package")
  max_kept: int = _opt(40, "tasks kept per package (packages.json may lower it)")
  runs: int = _opt(3, "test runs per check (baseline, empty patch, gold patch)")
  timeout_s: float = _opt(60.0, "seconds per pytest run (the baseline gets 3x)")
  tiny_size: int = _opt(20, "tasks in tiny/train.jsonl")
  only: tuple[str, ...] = _opt((), "build only these packages (others reuse their saved state)")
  fresh: bool = _opt(False, "ignore saved per-package build state")

  def __post_init__(self):
    for name, least in (("runs", 1), ("max_candidates", 1), ("max_kept", 1), ("tiny_size", 0)):
      if getattr(self, name) < least:
        raise ValueError(f"Options.{name} must be >= {least}, got {getattr(self, name)}")
    if self.timeout_s <= 0:
      raise ValueError(f"Options.timeout_s must be > 0, got {self.timeout_s}")
    object.__setattr__(self, "only", tuple(self.only))

  def resolved(self) -> "Options":
    """The same options with the machine defaults of `repos_dir` and `work_dir` filled in."""
    cache = os.environ.get("DOCKYARD_CACHE", os.path.expanduser("~/.cache/dockyard"))
    return dataclasses.replace(self, repos_dir=self.repos_dir or repos.default_repos_dir(),
                               work_dir=self.work_dir or os.path.join(cache, "build_swe", f"seed{self.seed}"))
