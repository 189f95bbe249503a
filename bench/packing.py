"""Benchmark: packed (+ token-budget) vs padded training steps on the SWE default's real lengths.

The lengths are the SWE default's (configs/swe.py, tiny): each prompt is the one the GRPO loop
sends for a training task (`SweEnv.prompt_messages` under `env.code.prompt_token_budget` /
`issue_token_budget`, rendered by the default tiny model's chat template), each completion as long
as a task's compact gold patch in its answer fence + the end token (the SFT warm start's targets,
which the warm-started policy reproduces: the recorded runs' `rollout/completion_len_mean` is
143-158 against the gold mean of 142). A step is one GRPO batch of `grpo.num_prompts_per_step`
tasks x `num_generations_per_prompt` completions, the completion lengths drawn from the 20 tasks'
gold lengths. Token ids are random (the step's cost does not depend on them).

Both trainers run the same batches with the clipped-PG loss, on the default tiny model, float32:
  JAX    padded: `optim.micro_batch_size` rows, lengths padded to `policy.seq_bucket`;
         packed: FFD rows of `policy.packing_row_tokens` (several lengths), one row a micro-batch;
         dynamic: `optim.micro_batch_tokens` = the padded micro-batch's token count (whole
         sequences by token budget, each micro-batch padded to its own longest rounded up to the
         bucket; one compiled step per (rows, length) bucket, gradients accumulated on the host).
  torch  padded: `micro_batch_size` rows; dynamic: `optim.micro_batch_tokens` = the padded
         micro-batch's token count (whole sequences by token budget); packed: FFD rows, trimmed,
         about that budget of rows a micro-batch.
Rounds alternate the variants so load from other processes hits all alike; each variant's batches
are compiled / warmed first. tokens/s counts real (unpadded) tokens, the same for every variant.

  python bench/packing.py [--smoke | --quick]

`--smoke` (CI: tests/bench) runs the same path once on 2 x 2 sequences. Ends with
`RESULT packing_speedup <padded JAX step time / the best JAX packed or token-budget step time> x`:
the JAX trainer's (the main one) best way of not computing padding, packed rows or dynamic
micro-batches, against its padded step.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from configs import swe


def swe_lengths() -> tuple[list[int], list[int]]:
  """(prompt tokens, completion tokens) of the SWE default's training tasks, made as the loop
  makes them (the task repos are built from the pinned sdists once per machine, as a run does)."""
  import transformers
  from dockyard import runner
  from dockyard.data import repos as repo_lib
  from dockyard.data import swe as swe_data
  from dockyard.envs.swe import SweEnv
  from dockyard.rollout.chat import encode_prompt
  config = swe.get_config()
  tok = transformers.AutoTokenizer.from_pretrained(runner.resolve_model(config))
  tasks = [t.to_dict() for t in swe_data.load_tasks(config.data.train)]
  repo_lib.ensure_repos(config.data.manifest, tasks)
  count = lambda text: len(tok(text, add_special_tokens=False)["input_ids"])
  code = config.env.code
  env = SweEnv(None, count, prompt_token_budget=code.prompt_token_budget,
               issue_token_budget=code.issue_token_budget, reward=code.reward)
  prompts = [len(encode_prompt(tok, env.prompt_messages(t))) for t in tasks]
  completions = [count(env.gold_completion(t)) + 1 for t in tasks]   # + the end-of-turn token
  return prompts, completions


def make_batches(prompts, completions, n_batches, n_prompts, n_gen, vocab, seed=0):
  from dockyard.policy import TrainBatch
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n_batches):
    rows = []
    for task in rng.choice(len(prompts), n_prompts, replace=False):
      rows += [(prompts[task], int(c)) for c in rng.choice(completions, n_gen)]
    t = max(p + c for p, c in rows)
    ids = rng.integers(3, vocab, (len(rows), t)).astype(np.int32)
    am = np.zeros_like(ids)
    lm = np.zeros(ids.shape, np.float32)
    for i, (p, c) in enumerate(rows):
      am[i, :p + c], lm[i, p:p + c] = 1, 1
      ids[i, p + c:] = 0
    adv = rng.standard_normal(len(rows)).astype(np.float32)
    prev = np.full(ids.shape, -np.log(vocab), np.float32) * am
    out.append(TrainBatch(ids, am, lm, extras=dict(advantages=adv, prev_logprobs=prev,
                                                   generation_logprobs=prev.copy())))
  return out


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  mode = ap.add_mutually_exclusive_group()
  mode.add_argument("--smoke", action="store_true", help="one round, 2 x 2 sequences (seconds)")
  mode.add_argument("--quick", action="store_true", help="1 batch, 3 rounds, rows of 2048 only (< 60 s idle)")
  ap.add_argument("--torch_threads", type=int, default=1,
                  help="torch intra-op threads (more oversubscribe a shared 2-core machine)")
  args = ap.parse_args()
  import jax
  import torch
  torch.set_num_threads(args.torch_threads)
  from dockyard import packing, runner
  from dockyard.grpo.loss_spec import LossConfig
  from dockyard.trainer_jax import loss as jax_loss
  from dockyard.trainer_jax import sharding as shd
  from dockyard.trainer_jax.policy import JaxPolicy
  from dockyard.trainer_torch import loss as torch_loss
  from dockyard.trainer_torch.policy import TorchPolicy

  config = swe.get_config()
  n_prompts, n_gen = config.grpo.num_prompts_per_step, config.grpo.num_generations_per_prompt
  n_batches, rounds, row_lengths = 4, 5, (1024, 1536, 2048)
  if args.quick:
    n_batches, rounds, row_lengths = 1, 3, (2048,)
  if args.smoke:
    n_batches, rounds, row_lengths, n_prompts, n_gen = 1, 1, (1024,), 2, 2
  t0 = time.perf_counter()
  prompts, completions = swe_lengths()
  path = runner.resolve_model(config)
  vocab = int(config.policy.tiny.vocab_size)
  batches = make_batches(prompts, completions, n_batches, n_prompts, n_gen, vocab)
  lengths = np.concatenate([packing.seq_lengths(b) for b in batches])
  real = float(lengths.sum()) / len(batches)
  print(f"lengths: prompts {min(prompts)}-{max(prompts)}, completions {min(completions)}-{max(completions)}; "
        f"{len(batches)} batches of {n_prompts} x {n_gen} sequences, {lengths.min()}-{lengths.max()} "
        f"tokens (mean {lengths.mean():.0f}); setup {time.perf_counter() - t0:.1f}s")

  loss_cfg = LossConfig.from_config(config)
  micro = int(config.optim.micro_batch_size)
  mesh = shd.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  pad_tokens = micro * max(int(np.ceil(b.input_ids.shape[1] / 64)) * 64 for b in batches)

  def jax_variant(row_tokens: int = 0, budget: int = 0):
    cfg = swe.get_config()
    cfg.policy.packing_row_tokens = row_tokens
    cfg.optim.micro_batch_tokens = budget
    # One packed row a micro-batch: the JAX step's micro-batches share one shape, so the empty rows
    # of a last, partly filled micro-batch of several rows would be computed (measured: 3 rows of
    # 2048 a micro-batch, about the padded one's token budget, 0.69 x padded; 1 row 0.92 x).
    cfg.optim.micro_batch_size = 1 if row_tokens else micro
    policy = JaxPolicy.from_hf(path, cfg, mesh=mesh)
    fn = jax_loss.make_pg_loss(loss_cfg)
    return lambda b: policy.train_step(b, fn)

  def torch_variant(row_tokens: int = 0, budget: int = 0):
    cfg = swe.get_config("torch")
    cfg.policy.packing_row_tokens = row_tokens
    cfg.optim.micro_batch_tokens = budget
    if row_tokens:
      cfg.optim.micro_batch_size = max(1, round(pad_tokens / row_tokens))
    policy = TorchPolicy.from_hf(path, cfg)
    fn = torch_loss.make_pg_loss(loss_cfg)
    return lambda b: policy.train_step(b, fn)

  variants = {"jax padded": jax_variant(0)}
  variants[f"jax dynamic {pad_tokens}"] = jax_variant(budget=pad_tokens)
  variants.update({f"jax packed {r}": jax_variant(r) for r in row_lengths})
  variants["torch padded"] = torch_variant()
  variants[f"torch dynamic {pad_tokens}"] = torch_variant(budget=pad_tokens)
  variants.update({f"torch packed {r}": torch_variant(row_tokens=r) for r in row_lengths})

  t0 = time.perf_counter()
  for step in variants.values():   # compile (JAX) / warm up every batch shape
    for b in batches:
      step(b)
  print(f"warm-up {time.perf_counter() - t0:.1f}s; padded micro-batch budget {pad_tokens} tokens")
  times = {name: [] for name in variants}
  for _ in range(rounds):
    for name, step in variants.items():
      t = time.perf_counter()
      for b in batches:
        step(b)
      times[name].append((time.perf_counter() - t) / len(batches))
  med = {name: statistics.median(ts) for name, ts in times.items()}
  computed = {}
  for r in row_lengths:   # the fill of the packed layout (rows of r tokens) vs the padded one
    rows = sum(len(packing.first_fit_decreasing(packing.seq_lengths(b), r)) for b in batches)
    computed[r] = real * len(batches) / (rows * r)
  fill_padded = real * len(batches) / sum(b.batch_size * int(np.ceil(b.input_ids.shape[1] / 64)) * 64
                                          for b in batches)
  print(f"real tokens per step {real:.0f}; fill: padded {fill_padded:.2f}, "
        + ", ".join(f"packed {r} {f:.2f}" for r, f in computed.items()))
  for backend in ("jax", "torch"):
    base = med[f"{backend} padded"]
    for name in (n for n in variants if n.startswith(backend)):
      print(f"{name:<22} step {med[name] * 1e3:8.1f} ms  {real / med[name]:9.0f} tokens/s  "
            f"{base / med[name]:6.3f} x padded")
  best = min((n for n in variants if n.startswith(("jax packed", "jax dynamic"))), key=med.get)
  print(f"best JAX variant: {best}", flush=True)
  print(f"RESULT packing_speedup {med['jax padded'] / med[best]:.3f} x")


if __name__ == "__main__":
  main()
