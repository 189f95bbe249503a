"""Checkpoint bookkeeping for the GRPO loops, on top of `Policy.save` / `Policy.restore`.

Two kinds, under `<workdir>/checkpoints/`:
  latest/        the newest state, for resuming (policy state + `loop_state.json`: step, sampler
                 position); written to a temporary directory and swapped in, so a crash mid-save
                 leaves the previous one intact.
  best/step_N/   the best `keep_top_k` states by a validation metric (`config.checkpoint.metric`,
                 `metric_mode`); `best/best_k.json` lists them, best first.

`save_fn(dir)` (normally `Policy.save`) always receives a directory that does not exist yet.
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Any, Callable

LOOP_STATE = "loop_state.json"


def _write_json(path: str, obj: Any) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2)
  os.replace(tmp, path)


def save_latest(root: str, save_fn: Callable[[str], None], loop_state: dict) -> str:
  """Saves through `save_fn(dir)` + loop_state.json into root/latest, replacing the old one."""
  final = os.path.join(root, "latest")
  tmp = os.path.join(root, "latest.tmp")
  shutil.rmtree(tmp, ignore_errors=True)
  save_fn(tmp)   # a path that does not exist yet: orbax refuses to overwrite
  os.makedirs(tmp, exist_ok=True)
  _write_json(os.path.join(tmp, LOOP_STATE), loop_state)
  old = os.path.join(root, "latest.old")
  shutil.rmtree(old, ignore_errors=True)
  if os.path.exists(final):
    os.rename(final, old)
  os.rename(tmp, final)
  shutil.rmtree(old, ignore_errors=True)
  return final


def load_latest(root: str) -> tuple[str, dict] | None:
  """(directory, loop_state) of root/latest, or None when there is nothing to resume."""
  path = os.path.join(root, "latest")
  state = os.path.join(path, LOOP_STATE)
  if not os.path.exists(state):
    return None
  with open(state) as f:
    return path, json.load(f)


class BestK:
  """Keeps the `k` best checkpoints by a metric; the rest are deleted as better ones arrive."""

  def __init__(self, root: str, k: int, mode: str = "max"):
    if k < 1:
      raise ValueError(f"checkpoint.keep_top_k must be >= 1, got {k}")
    if mode not in ("max", "min"):
      raise ValueError(f"checkpoint.metric_mode must be 'max' or 'min', got {mode!r}")
    self.root, self.k, self.mode = os.path.join(root, "best"), k, mode
    os.makedirs(self.root, exist_ok=True)
    self._index = os.path.join(self.root, "best_k.json")
    self.entries: list[dict] = []
    if os.path.exists(self._index):
      with open(self._index) as f:
        self.entries = json.load(f)

  def _better(self, a: float, b: float) -> bool:
    return a > b if self.mode == "max" else a < b

  def qualifies(self, value: float) -> bool:
    return len(self.entries) < self.k or self._better(value, self.entries[-1]["value"])

  def offer(self, step: int, value: float, save_fn: Callable[[str], None]) -> bool:
    """Saves the state when `value` ranks in the top k; returns whether it did."""
    if not self.qualifies(value):
      return False
    path = os.path.join(self.root, f"step_{step:06d}")
    shutil.rmtree(path, ignore_errors=True)
    save_fn(path)
    self.entries = [e for e in self.entries if e["step"] != step]
    self.entries.append(dict(step=int(step), value=float(value), path=path))
    # Ties keep the earlier checkpoint ahead (a stable sort on the value alone).
    self.entries.sort(key=lambda e: -e["value"] if self.mode == "max" else e["value"])
    for dropped in self.entries[self.k:]:
      shutil.rmtree(dropped["path"], ignore_errors=True)
    self.entries = self.entries[:self.k]
    _write_json(self._index, self.entries)
    return True

  @property
  def best(self) -> dict | None:
    return self.entries[0] if self.entries else None
