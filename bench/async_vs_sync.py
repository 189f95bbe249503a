"""Async vs sync GRPO: the same optimizer steps on the same config, both measured in one run.

  python bench/async_vs_sync.py --quick      # < 60 s on a 2-core CPU machine
  python bench/async_vs_sync.py --smoke      # 1 step x 2 prompts x 2 samples, seconds (CI)

Real parts: a tiny Qwen2 model made locally (`dockyard.models.tiny`), the JAX trainer
(`JaxPolicy`), one in-process CPU vLLM engine with the in-process refit transport and its
canary, and the math env (in-process verifier). The SWE env is not used: a randomly initialized
tiny model never writes a parseable diff, so the SWE env would mark every completion malformed
without calling the sandbox, and its score side would measure nothing. The math config's KL
penalty is on, so every train step also runs a reference policy's forward (the checkpoint, built
once), as the real loop does. A warm-up sync step compiles the trainer first; then the sync run
and the async run each take `--steps` optimizer steps from the same start: one policy, restored
to its initial checkpoint (weights, optimizer state, step) before each run, so the jitted step
compiled in the warm-up is reused and neither timed run includes a compile.

Prints each run's wall time and step times, then for async the ratio of its mean step time to
max(train + refit per step, generate + score per step), train from the async run, generate +
score once from the sync run (a step's worth of groups with nothing else running) and once from
the async run (engine busy time in batches + scoring): 1.0 means the two sides overlapped
perfectly; below 1 vs the sync figure means async generation itself got faster (bigger batches). Last line:
  RESULT async_speedup <sync wall / async wall> x
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def make_config(args):
  from dockyard import validate
  config = validate.load_config_file(os.path.join(ROOT, "configs/math.py"))
  grpo = config.grpo
  grpo.num_prompts_per_step, grpo.num_generations_per_prompt = args.prompts, args.generations
  grpo.max_num_steps, grpo.val_at_start, grpo.val_period = args.steps, False, 0
  grpo.sft_warmup.steps, grpo.dynamic_sampling = 0, False
  grpo.async_grpo.enabled = True
  grpo.async_grpo.max_trajectory_age_steps = 1
  config.rollout.max_new_tokens, config.rollout.max_model_len = args.max_new_tokens, 256
  config.policy.max_seq_len = 256
  config.optim.micro_batch_size = args.prompts * args.generations
  config.optim.decay_steps = 100          # one schedule for the warm-up, sync and async runs
  config.checkpoint.enabled = False
  config.logging.tensorboard, config.logging.png_curve = False, False
  validate.validate(config)
  return config


def mean_of(rows, *keys):
  import numpy as np
  return float(np.mean([sum(r.get(k, 0.0) for k in keys) for r in rows]))


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  mode = p.add_mutually_exclusive_group()
  mode.add_argument("--smoke", action="store_true", help="one tiny step per run (seconds)")
  mode.add_argument("--quick", action="store_true", help="a few short steps (< 60 s)")
  p.add_argument("--steps", type=int, default=None)
  p.add_argument("--prompts", type=int, default=None)
  p.add_argument("--generations", type=int, default=None)
  p.add_argument("--max_new_tokens", type=int, default=None)
  args = p.parse_args()
  smoke = dict(steps=1, prompts=2, generations=2, max_new_tokens=4)
  quick = dict(steps=3, prompts=2, generations=4, max_new_tokens=12)
  full = dict(steps=10, prompts=4, generations=8, max_new_tokens=48)
  for k, v in (smoke if args.smoke else quick if args.quick else full).items():
    if getattr(args, k) is None:
      setattr(args, k, v)
  if min(args.steps, args.prompts, args.max_new_tokens) < 1 or args.generations < 2:
    p.error("--steps, --prompts, --max_new_tokens must be >= 1 and --generations >= 2")
  logging.basicConfig(level=logging.WARNING)
  t_all = time.perf_counter()

  from transformers import AutoTokenizer

  from dockyard.envs.math import MathConfig, MathEnv
  from dockyard.grpo.loop import grpo_train
  from dockyard.grpo.source import make_source
  from dockyard.grpo.step import refit
  from dockyard.policy_factory import make_losses
  from dockyard.models.tiny import make_tiny_model
  from dockyard.refit.synchronizer import create_weight_synchronizer
  from dockyard.rollout.vllm_engine import VLLMEngine
  try:
    from dockyard.trainer_jax.policy import JaxPolicy
  except ImportError as e:
    sys.exit(f"bench/async_vs_sync.py needs the JAX trainer (dockyard.trainer_jax.policy): {e}")

  config = make_config(args)
  model_path = make_tiny_model(dict(config.policy.tiny))
  tokenizer = AutoTokenizer.from_pretrained(model_path)
  engine = VLLMEngine(model_path, config.rollout, seed=config.run.seed)
  env = MathEnv(MathConfig.from_config(config))
  # The math config's KL penalty needs a reference policy. No warm start here, so the reference
  # is the checkpoint itself: built once and shared by the three runs (as the runner would build
  # it, but not per run, so its forward compiles once).
  reference = JaxPolicy.from_hf(model_path, config) if config.loss_fn.reference_policy_kl_penalty else None
  # One pair of loss callables for all runs: the loss is a static argument of the jitted train
  # step, so a fresh one per run would recompile it inside each timed run's first step.
  losses = make_losses(config)
  # One policy, reset to its initial checkpoint before each run: a new JaxPolicy would bring a new
  # optax transform into the jitted step's static graph and recompile it inside the timed run.
  policy = JaxPolicy.from_hf(model_path, config)
  print(f"setup (model, tokenizer, vLLM engine, policies): {time.perf_counter() - t_all:.1f} s", flush=True)

  def run(is_async, steps, workdir):
    run_config = config.copy_and_resolve_references()
    run_config.grpo.max_num_steps = steps
    run_config.grpo.async_grpo.enabled = is_async   # the source the runner would build for it
    policy.restore(initial)          # same weights, optimizer state and step for every run
    sync = create_weight_synchronizer(run_config, policy, engine)
    refit(sync)                      # the engine starts every run from the same weights
    source = make_source(run_config, generator=engine, env=env, tokenizer=tokenizer, train_tasks=env.train,
                         synchronizer=sync)
    t0 = time.perf_counter()
    grpo_train(run_config, source=source, policy=policy, generator=engine, synchronizer=sync, env=env,
               tokenizer=tokenizer, train_tasks=env.train, val_tasks=env.validation, workdir=workdir,
               reference=reference, losses=losses, progress=False)
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    return wall, [r for r in rows if "time/step" in r]

  with tempfile.TemporaryDirectory() as tmp:
    initial = os.path.join(tmp, "initial")
    policy.save(initial)
    run(False, 1, os.path.join(tmp, "warmup"))          # jit compile, engine warm-up
    sync_wall, sync_rows = run(False, args.steps, os.path.join(tmp, "sync"))
    async_wall, async_rows = run(True, args.steps, os.path.join(tmp, "async"))

  gen_score = mean_of(sync_rows, "time/generate", "time/score")
  train_sync = mean_of(sync_rows, "time/train", "time/refit")
  train_async = mean_of(async_rows, "time/train", "time/refit")
  step_async = async_wall / args.steps
  bound = max(train_async, gen_score)
  print(f"config: {args.steps} steps x {args.prompts} prompts x {args.generations} samples, "
        f"max_new_tokens {args.max_new_tokens}")
  print(f"sync : {sync_wall:.2f} s  ({sync_wall / args.steps:.3f} s/step: generate+score {gen_score:.3f}, "
        f"train+refit {train_sync:.3f})")
  print(f"async: {async_wall:.2f} s  ({step_async:.3f} s/step: train+refit {train_async:.3f}, waiting for "
        f"groups {mean_of(async_rows, 'time/wait'):.3f}, mean age "
        f"{mean_of(async_rows, 'async/age_mean'):.2f})")
  print(f"async step / max(train, generate+score) = {step_async:.3f} / {bound:.3f} = {step_async / bound:.3f}"
        "  (generate+score from the sync run)")
  # The same bound with generate+score as the async run itself saw it: the engine's busy time in
  # batches (larger batches than sync's, and sharing the cores with the trainer) + scoring.
  busy = (async_rows[-1]["async/engine_busy_s"] + async_rows[-1]["async/score_busy_s"]) / args.steps
  bound_async = max(train_async, busy)
  print(f"async step / max(train, generate+score) = {step_async:.3f} / {bound_async:.3f} = "
        f"{step_async / bound_async:.3f}  (generate+score from the async run's engine busy time)")
  print(f"total bench time {time.perf_counter() - t_all:.1f} s")
  print(f"RESULT async_speedup {sync_wall / async_wall:.3f} x")


if __name__ == "__main__":
  main()
