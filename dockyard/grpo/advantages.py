"""Advantage estimators for groups of completions of the same prompt (`config.grpo.advantage`).

Input: rewards [G, n] (G groups = prompts, n completions each), shaped already. Output: one
advantage per completion [G, n] plus which groups had zero reward variance (every completion
scored the same: no learning signal under a group baseline). With `dynamic_sampling` (DAPO) the
loop drops those groups; either way their fraction is reported.

  grpo         A = r - baseline; baseline = mean of the OTHER n-1 rewards (leave_one_out) or the
               group mean; with normalize_std, A /= (group std + eps).
  gdpo         multi-reward (GDPO): each reward component is z-scored within its group
               ((c - group mean) / (group std + eps), 0 where the std is 0), the normalized
               components are summed; with normalize_std the sum is then normalized over the
               whole batch (mean 0, std 1). Without components it is `grpo` with std scaling.
  reinforce++  no group baseline: A = (r - batch mean) / (batch std + eps) (global batch norm).
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

ESTIMATORS = ("grpo", "gdpo", "reinforce++")
EPS = 1e-6


@dataclasses.dataclass
class Advantages:
  values: np.ndarray          # [G, n] float32
  zero_variance: np.ndarray   # [G] bool: all rewards of the group are equal

  @property
  def zero_variance_fraction(self) -> float:
    return float(self.zero_variance.mean()) if self.zero_variance.size else 0.0


def _group_zscore(x: np.ndarray) -> np.ndarray:
  std = x.std(axis=1, keepdims=True)
  z = (x - x.mean(axis=1, keepdims=True)) / (std + EPS)
  return np.where(std > 0, z, 0.0)


def compute_advantages(rewards, estimator: str = "grpo", leave_one_out: bool = True,
                       normalize_std: bool = False,
                       components: Mapping[str, Sequence] | None = None) -> Advantages:
  """rewards: [G, n]; components (gdpo): name -> [G, n]. Returns `Advantages`."""
  r = np.asarray(rewards, np.float64)
  if r.ndim != 2 or r.shape[1] < 2:
    raise ValueError(f"rewards must be [num_groups, group_size >= 2], got shape {r.shape}")
  if not np.all(np.isfinite(r)):
    raise ValueError("rewards contain NaN or inf")
  if estimator not in ESTIMATORS:
    raise ValueError(f"grpo.advantage.estimator must be one of {ESTIMATORS}, got {estimator!r}")
  n = r.shape[1]
  zero_var = np.ptp(r, axis=1) == 0

  if estimator == "grpo":
    if leave_one_out:
      baseline = (r.sum(axis=1, keepdims=True) - r) / (n - 1)
    else:
      baseline = r.mean(axis=1, keepdims=True)
    adv = r - baseline
    if normalize_std:
      adv = adv / (r.std(axis=1, keepdims=True) + EPS)
  elif estimator == "gdpo":
    comps = {"reward": r} if not components else {
        k: np.asarray(v, np.float64) for k, v in components.items()}
    for k, v in comps.items():
      if v.shape != r.shape:
        raise ValueError(f"reward component {k!r} has shape {v.shape}, rewards have {r.shape}")
    adv = sum(_group_zscore(v) for v in comps.values())
    # A group is only uninformative if every component is flat in it.
    zero_var = np.all([np.ptp(v, axis=1) == 0 for v in comps.values()], axis=0)
    if normalize_std:
      adv = (adv - adv.mean()) / (adv.std() + EPS)
  else:
    adv = (r - r.mean()) / (r.std() + EPS)
  return Advantages(values=adv.astype(np.float32), zero_variance=zero_var)
