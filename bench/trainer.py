"""Benchmark: JAX train step vs PyTorch eager (transformers) on the same model and batch, one run.

Both sides do the same work per step: forward, masked token-mean NLL, backward, global-norm
clipping and an AdamW update, in float32 on the CPU. Rounds alternate JAX / torch so that load
from other processes hits both alike; the median step time of each is compared.

  python bench/trainer.py [--smoke | --quick]

`--smoke` (CI: tests/bench) runs the same path for one round on the default tiny model
(0.5M parameters), batch 2 x 16 tokens.
Ends with `RESULT jax_vs_torch_step <torch time / JAX time> x`.
"""
from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np
import torch
import transformers

from configs import swe
from dockyard.models.tiny import DEFAULT_SPEC, make_tiny_model
from dockyard.trainer_jax import sharding as shd
from dockyard.trainer_jax import train
from dockyard.trainer_jax.loss import nll_loss
from dockyard.trainer_jax.policy import JaxPolicy

# full and --quick; --smoke uses the default tiny model (DEFAULT_SPEC).
SPEC = dict(family="qwen2", hidden_size=256, intermediate_size=768, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=2048, tie_word_embeddings=True)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  mode = ap.add_mutually_exclusive_group()
  mode.add_argument("--smoke", action="store_true", help="one round, tiny model and batch (seconds)")
  mode.add_argument("--quick", action="store_true", help="fewer rounds, shorter sequences (< 60 s)")
  ap.add_argument("--torch_threads", type=int, default=1,
                  help="torch intra-op threads; on a shared 2-core machine more threads oversubscribe "
                       "the cores and torch's step gets ~10x slower, an unfair baseline")
  args = ap.parse_args()
  torch.set_num_threads(args.torch_threads)
  batch, seq, rounds = (2, 16, 1) if args.smoke else (4, 64, 5) if args.quick else (16, 256, 20)
  spec = DEFAULT_SPEC if args.smoke else SPEC
  path = make_tiny_model(spec)

  config = swe.get_config()
  config.optim.micro_batch_size = batch
  config.optim.warmup_steps = 0
  mesh = shd.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  policy = JaxPolicy.from_hf(path, config, mesh=mesh)
  n_params = policy.model.config.num_params()

  rng = np.random.default_rng(0)
  ids = rng.integers(0, spec["vocab_size"], (batch, seq)).astype(np.int32)
  loss_mask = np.ones_like(ids)
  loss_mask[:, : seq // 4] = 0  # a prompt quarter that is not trained on
  put = lambda x: jax.device_put(x[None], shd.batch_sharding(mesh, policy.rules, 3, 1))
  jax_batch = dict(input_ids=put(ids), attention_mask=put(np.ones_like(ids)),
                   loss_mask=put(loss_mask.astype(np.float32)), extras={},
                   totals=dict(total_tokens=np.float32(loss_mask.sum()), total_sequences=np.float32(batch)))

  def jax_step():
    metrics = train.train_step(policy.model, policy.optimizer, jax_batch, nll_loss)
    return float(jax.block_until_ready(metrics["loss"]))

  tmodel = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
  tmodel.train()
  topt = torch.optim.AdamW(tmodel.parameters(), lr=config.optim.lr, betas=(config.optim.b1, config.optim.b2),
                           eps=config.optim.eps, weight_decay=config.optim.weight_decay)
  t_ids, t_mask = torch.tensor(ids, dtype=torch.long), torch.tensor(loss_mask, dtype=torch.float32)

  def torch_step():
    logits = tmodel(t_ids).logits
    logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, t_ids[:, 1:, None])[..., 0]
    loss = -(logp * t_mask[:, 1:]).sum() / t_mask.sum()
    topt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(tmodel.parameters(), config.optim.max_grad_norm)
    topt.step()
    return loss.detach().item()

  t0 = time.perf_counter()
  first_jax, first_torch = jax_step(), torch_step()  # compile / warm up
  print(f"warm-up {time.perf_counter() - t0:.1f}s; first losses jax {first_jax:.5f} torch {first_torch:.5f}")
  if abs(first_jax - first_torch) > 1e-3:  # not the same computation: the ratio would mean nothing
    raise SystemExit(f"JAX and torch disagree on the first loss: {first_jax} vs {first_torch}")
  jax_times, torch_times = [], []
  for _ in range(rounds):
    for fn, times in ((jax_step, jax_times), (torch_step, torch_times)):
      t = time.perf_counter()
      fn()
      times.append(time.perf_counter() - t)
  tokens = batch * seq
  jt, tt = statistics.median(jax_times), statistics.median(torch_times)
  print(f"model: {n_params / 1e6:.2f}M params, batch {batch} x {seq} tokens, {rounds} rounds, "
        f"torch threads {torch.get_num_threads()}")
  print(f"jax   step median {jt * 1e3:8.1f} ms  {tokens / jt:10.0f} tokens/s")
  print(f"torch step median {tt * 1e3:8.1f} ms  {tokens / tt:10.0f} tokens/s")
  print(f"RESULT jax_vs_torch_step {tt / jt:.3f} x")


if __name__ == "__main__":
  main()
