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


# JAX's persistent compilation cache for benches that start a fresh trainer each run: a rerun loads
# the jitted steps instead of compiling them (their first, untimed step gets shorter; the timed
# steps do not change).
JAX_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "dockyard", "bench", "jax_compilation_cache")


def use_jax_compilation_cache() -> str:
  """Points this process's JAX at JAX_CACHE (before its first compile); returns the directory."""
  import jax
  jax.config.update("jax_compilation_cache_dir", JAX_CACHE)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  return JAX_CACHE
