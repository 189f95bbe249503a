"""Benchmark: JAX train-step tokens/s of a Qwen3-MoE vs a dense Qwen3 of the same active size, one run.

The dense model's MLP is `intermediate_size` wide; the MoE's tokens each meet `top_k` experts of
width `intermediate_size / top_k`, so both do the same MLP FLOPs per token (attention, embeddings
and norms identical); the MoE holds `num_experts / top_k` times the MLP weights and pays for the
router, the sort by expert and the grouped GEMM (`jax.lax.ragged_dot`). Both run the jitted
`train_step` (forward, masked NLL, backward, AdamW) in float32 on one CPU device; rounds alternate
so that load from other processes hits both alike; median step times are compared.

  python bench/moe.py [--smoke | --quick]

`--smoke` (CI: tests/bench) runs one round on 2-layer models, batch 2 x 16 tokens.
Ends with `RESULT moe_vs_dense_tokens_per_s <MoE tokens/s / dense tokens/s> x`.
"""
from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np

from configs import swe
from dockyard.models.tiny import make_tiny_model
from dockyard.trainer_jax import sharding as shd
from dockyard.trainer_jax import train
from dockyard.trainer_jax.loss import nll_loss
from dockyard.trainer_jax.policy import JaxPolicy

TOP_K, EXPERTS = 2, 8


def specs(smoke: bool) -> dict[str, dict]:
  common = dict(hidden_size=128 if smoke else 256, num_hidden_layers=2 if smoke else 4,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=1024 if smoke else 2048,
                tie_word_embeddings=True)
  width = 256 if smoke else 768
  return {"dense": dict(family="qwen3", intermediate_size=width, **common),
          "moe": dict(family="qwen3_moe", intermediate_size=width, num_experts=EXPERTS,
                      num_experts_per_tok=TOP_K, moe_intermediate_size=width // TOP_K,
                      norm_topk_prob=True, **common)}


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  mode = ap.add_mutually_exclusive_group()
  mode.add_argument("--smoke", action="store_true", help="one round, 2-layer models, tiny batch (seconds)")
  mode.add_argument("--quick", action="store_true", help="fewer rounds, shorter sequences (< 60 s)")
  args = ap.parse_args()
  batch, seq, rounds = (2, 16, 1) if args.smoke else (4, 64, 5) if args.quick else (16, 256, 20)
  config = swe.get_config()
  config.optim.micro_batch_size = batch
  config.optim.warmup_steps = 0
  mesh = shd.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  steps, sizes = {}, {}
  for name, spec in specs(args.smoke).items():
    policy = JaxPolicy.from_hf(make_tiny_model(spec), config, mesh=mesh)
    c = policy.model.config
    sizes[name] = (c.num_params(), c.num_params(active=True))
    rng = np.random.default_rng(0)
    ids = rng.integers(0, c.vocab_size, (batch, seq)).astype(np.int32)
    loss_mask = np.ones_like(ids)
    loss_mask[:, : seq // 4] = 0
    put = lambda x: jax.device_put(x[None], shd.batch_sharding(mesh, policy.rules, 3, 1))  # noqa: E731
    data = dict(input_ids=put(ids), attention_mask=put(np.ones_like(ids)),
                loss_mask=put(loss_mask.astype(np.float32)), extras={},
                totals=dict(total_tokens=np.float32(loss_mask.sum()), total_sequences=np.float32(batch)))

    def step(policy=policy, data=data):
      metrics = train.train_step(policy.model, policy.optimizer, data, nll_loss, policy.moe)
      return float(jax.block_until_ready(metrics["loss"]))
    t0 = time.perf_counter()
    first = step()   # compile
    print(f"{name}: compile + first step {time.perf_counter() - t0:.1f}s, loss {first:.4f}")
    steps[name] = step
  times = {name: [] for name in steps}
  for _ in range(rounds):
    for name, step in steps.items():
      t = time.perf_counter()
      step()
      times[name].append(time.perf_counter() - t)
  tokens = batch * seq
  rate = {name: tokens / statistics.median(ts) for name, ts in times.items()}
  for name in steps:
    total, active = sizes[name]
    print(f"{name:5s}: {total / 1e6:6.2f}M params ({active / 1e6:.2f}M active), step median "
          f"{statistics.median(times[name]) * 1e3:8.1f} ms, {rate[name]:9.0f} tokens/s")
  print(f"batch {batch} x {seq} tokens, {rounds} rounds, {jax.devices()[0].platform}")
  print(f"RESULT moe_vs_dense_tokens_per_s {rate['moe'] / rate['dense']:.3f} x")


if __name__ == "__main__":
  main()
