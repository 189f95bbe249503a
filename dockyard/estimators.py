"""Evaluation statistics: the unbiased pass@k estimator and the confidence intervals reported beside it.

pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1): with n
samples of a problem of which c are correct, the chance that k samples drawn without replacement
from those n contain a correct one is 1 - C(n-c, k) / C(n, k); its mean over problems is an
unbiased estimate of pass@k (taking the best of the first k samples is not: it has more variance).

Intervals: Wilson's score interval for a proportion (pass@1 of one greedy sample per problem);
a percentile bootstrap over problems for pass@k (per-problem values are not Bernoulli). Pure
NumPy, no model code, so the GRPO harness and the eval can both import it.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
  """The Wilson score interval of a binomial proportion (well-behaved at 0, 1 and small n)."""
  if n == 0:
    return (0.0, 1.0)
  if not 0 <= successes <= n:
    raise ValueError(f"wilson_interval: successes must be in [0, {n}], got {successes}")
  p = successes / n
  denom = 1 + z * z / n
  centre = (p + z * z / (2 * n)) / denom
  half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
  return (max(0.0, centre - half), min(1.0, centre + half))


def pass_at_k(n: int, c: int, k: int) -> float:
  """1 - C(n-c, k) / C(n, k): the chance k of the n samples (c correct) include a correct one."""
  if k < 1 or n < k:
    raise ValueError(f"pass_at_k needs 1 <= k <= n, got n={n}, k={k}")
  if not 0 <= c <= n:
    raise ValueError(f"pass_at_k needs 0 <= c <= n, got n={n}, c={c}")
  if n - c < k:   # fewer than k wrong samples: every k-subset holds a correct one
    return 1.0
  # The product form of C(n-c, k) / C(n, k) (no huge binomials, stable for large n).
  return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def pass_at_k_per_problem(counts: Sequence[tuple[int, int]], k: int) -> np.ndarray:
  """pass@k of each problem from its (n samples, c correct)."""
  return np.array([pass_at_k(int(n), int(c), k) for n, c in counts], np.float64)


def bootstrap_ci(values: Sequence[float], resamples: int = 1000, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float]:
  """Percentile bootstrap interval of the mean of `values` (problems resampled with replacement)."""
  v = np.asarray(values, np.float64)
  if v.size == 0:
    return (0.0, 1.0)
  if resamples < 1:
    raise ValueError(f"bootstrap_ci: resamples must be >= 1, got {resamples}")
  rng = np.random.default_rng(seed)
  means = v[rng.integers(0, v.size, size=(resamples, v.size))].mean(axis=1)
  alpha = (1.0 - level) / 2
  lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
  return (float(lo), float(hi))
