"""Runs async GRPO on the real stack into a workdir, resuming whatever is there: the JAX trainer
on a tiny Qwen2 made locally, one in-process CPU vLLM engine, the WeightSynchronizer, the math env.

The real-parts SIGKILL + resume test starts this as a subprocess and kills it mid-run:
  python tests/grpo_async/run_async_real.py WORKDIR STEPS
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "grpo")]
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from async_parts import async_config
from grpo_fakes import run_grpo


def config_for(steps: int):
  return async_config(**{"grpo.num_prompts_per_step": 2, "grpo.num_generations_per_prompt": 4,
                         "grpo.max_num_steps": steps, "rollout.max_new_tokens": 8, "optim.decay_steps": 100,
                         "optim.micro_batch_size": 8, "checkpoint.save_period": 1,
                         "grpo.async_grpo.consume_in_order": True, "grpo.async_grpo.max_trajectory_age_steps": 2})


def build(config):
  """(model path, tokenizer, engine) for `config` (the tiny model is cached by its spec)."""
  from transformers import AutoTokenizer

  from dockyard.models.tiny import make_tiny_model
  from dockyard.rollout.vllm_engine import VLLMEngine
  path = make_tiny_model(dict(config.policy.tiny))
  return path, AutoTokenizer.from_pretrained(path), VLLMEngine(path, config.rollout, seed=0)


def main(workdir: str, steps: int, parts=None):
  from dockyard.envs.math import MathConfig, MathEnv
  from dockyard.grpo.step import refit
  from dockyard.refit.synchronizer import create_weight_synchronizer
  from dockyard.trainer_jax.policy import JaxPolicy
  config = config_for(steps)
  path, tokenizer, engine = parts or build(config)
  env = MathEnv(MathConfig.from_config(config))
  policy = JaxPolicy.from_hf(path, config)
  sync = create_weight_synchronizer(config, policy, engine)
  refit(sync)   # a shared engine may hold another run's weights
  return run_grpo(config, policy=policy, generator=engine, synchronizer=sync, env=env,
                  tokenizer=tokenizer, train_tasks=env.train, val_tasks=env.validation,
                  workdir=workdir, progress=False)


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]))
