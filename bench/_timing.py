"""Timing helpers the benchmarks share (not a bench: tests/bench skips files starting with '_')."""
from __future__ import annotations

import os
import time


def best_time(fn, reps: int) -> float:
  """Shortest of `reps` timed calls (after one untimed call): a rate under load."""
  fn()
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return min(times)


def torch_matmul_gflops(n: int, reps: int) -> float:
  """fp32 GFLOP/s of an n x n x n torch matmul, torch on every core of this process for it."""
  import torch
  a, b = torch.randn(n, n), torch.randn(n, n)
  threads = torch.get_num_threads()
  torch.set_num_threads(len(os.sched_getaffinity(0)))
  try:
    return 2 * n ** 3 / best_time(lambda: torch.matmul(a, b), reps) / 1e9
  finally:
    torch.set_num_threads(threads)
