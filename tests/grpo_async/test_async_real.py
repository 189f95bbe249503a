"""Async GRPO end to end on real parts: the JAX trainer (`JaxPolicy`) on a tiny Qwen2 made here,
one in-process CPU vLLM engine, the WeightSynchronizer (in-process transport + refit canary), the
math env. (Resume on this stack, after a SIGKILL: test_kill_resume.py.)"""
import json

import numpy as np

from dockyard.envs.math import MathConfig, MathEnv
from dockyard.grpo import async_source
from dockyard.grpo.step import refit
from dockyard.refit.synchronizer import create_weight_synchronizer
from grpo_fakes import run_grpo


def test_async_grpo_on_jax_trainer_and_vllm(real_parts, tmp_path):
  from dockyard.trainer_jax.policy import JaxPolicy
  config, path, tokenizer, engine = real_parts
  env = MathEnv(MathConfig.from_config(config))

  def train(steps):
    run_config = config.copy_and_resolve_references()
    run_config.grpo.max_num_steps = steps
    policy = JaxPolicy.from_hf(path, run_config)
    sync = create_weight_synchronizer(run_config, policy, engine)
    refit(sync)   # the shared engine starts from this policy's weights
    res = run_grpo(run_config, policy=policy, generator=engine, synchronizer=sync, env=env, tokenizer=tokenizer,
                   train_tasks=env.train, val_tasks=env.validation, workdir=str(tmp_path), progress=False)
    return res, policy

  c_age = config.grpo.async_grpo.max_trajectory_age_steps
  res, _ = train(3)
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  steps = [r for r in rows if "time/step" in r]
  assert [r["step"] for r in steps] == [1, 2, 3] and res.resumed_from is None
  for r in steps:
    # the canary checked every push: vLLM's logprobs of the new weights match the trainer's
    assert r["refit/canary/max_abs_logprob_delta"] <= config.refit.canary.max_abs_logprob_delta
    assert r["refit/version"] == r["weight_version"]
    assert np.isfinite(r["train/is_weight_mean"]) and r["async/age_max"] <= c_age
    # vLLM fp32 vs the JAX trainer on fresh groups: the sampler's logprobs are the generating policy's
    assert r["train/is_logprob_abs_diff_mean"] < (0.5 if r["async/age_max"] else 1e-2)
  log = [json.loads(line) for line in open(tmp_path / async_source.ASYNC_LOG)]
  trained = [s for row in log if "seqs" in row for s in row["seqs"]]
  assert len(trained) == len(set(trained)) == 6
