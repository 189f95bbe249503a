"""Refit cost: one full weight sync into a vLLM engine vs a plain memcpy of the same bytes.

A ~51M-parameter Qwen2-shaped model is made locally (`make_tiny_model` with a bigger spec); its
HF weights play the trainer's `named_weights()`. Both are timed in this run, side by side:
the sync (default: the colocated in-process transport: pack -> collective_rpc -> vLLM
`reload_weights` -> tied-head repack) and `np.copyto` of the same number of bytes. The shared-
memory transport is timed too and printed for information.

  python bench/refit.py [--smoke | --quick]

`--smoke` (CI: tests/bench) runs the same path once on the default tiny model (0.5M parameters);
its ratio means little. Ends with `RESULT refit_vs_memcpy <sync_time / memcpy_time> x`.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

# full and --quick; --smoke uses the default tiny model.
SPEC = dict(family="qwen2", hidden_size=768, intermediate_size=2048, num_hidden_layers=8,
            num_attention_heads=12, num_key_value_heads=4, vocab_size=1024, tie_word_embeddings=True,
            max_position_embeddings=1024)


def median_time(fn, reps: int) -> float:
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  mode = parser.add_mutually_exclusive_group()
  mode.add_argument("--smoke", action="store_true", help="one repetition on the tiny model (seconds)")
  mode.add_argument("--quick", action="store_true", help="fewer repetitions (under a minute)")
  args = parser.parse_args()
  import numpy as np
  from safetensors.numpy import load_file

  from configs import swe
  from dockyard.models.tiny import make_tiny_model
  from dockyard.refit.transports import InProcessTransport, SharedMemoryTransport
  from dockyard.rollout.vllm_engine import VLLMEngine

  path = make_tiny_model(None if args.smoke else SPEC)
  weights = list(load_file(os.path.join(path, "model.safetensors")).items())
  nbytes = sum(a.nbytes for _, a in weights)
  params = sum(a.size for _, a in weights)
  rollout = swe.get_config("tiny").rollout
  rollout.max_model_len = 512
  engine = VLLMEngine(path, rollout)
  reps = 1 if args.smoke else 3 if args.quick else 10

  src = np.empty(nbytes, np.uint8)
  src[:] = 1
  dst = np.empty_like(src)
  memcpy = median_time(lambda: np.copyto(dst, src), reps * 3)

  version = [engine.weight_version]

  def sync(transport):
    def run():
      version[0] += 1
      transport.send(iter(weights), version[0])
    return run

  inprocess = median_time(sync(InProcessTransport(engine)), reps)
  shm = median_time(sync(SharedMemoryTransport(engine)), reps)
  print(f"model: {params / 1e6:.1f}M parameters, {nbytes / 1e6:.1f} MB fp32, {len(weights)} tensors")
  print(f"memcpy (np.copyto)           {memcpy * 1e3:8.2f} ms  ({nbytes / memcpy / 1e9:.2f} GB/s)")
  print(f"sync inprocess (default)     {inprocess * 1e3:8.2f} ms  ({nbytes / inprocess / 1e9:.2f} GB/s)")
  print(f"sync shared_memory           {shm * 1e3:8.2f} ms  ({nbytes / shm / 1e9:.2f} GB/s)")
  print(f"RESULT refit_vs_memcpy {inprocess / memcpy:.2f} x")


if __name__ == "__main__":
  main()
