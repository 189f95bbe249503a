"""Runs async GRPO on the bigram fakes into a workdir, resuming whatever is there.

The SIGKILL + resume test starts this as a real subprocess and kills it mid-run:
  python tests/grpo_async/run_async_fake.py TOKENIZER_DIR WORKDIR STEPS DELAY_S
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "grpo")]
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np

from async_parts import FirstDigitEnv, SlowGenerator, async_config
from dockyard.envs.math import MathConfig
from grpo_fakes import BigramPolicy, FakeSynchronizer, run_grpo


def config_for(steps: int):
  return async_config(**{"grpo.num_prompts_per_step": 2, "grpo.num_generations_per_prompt": 4,
                         "grpo.max_num_steps": steps, "checkpoint.save_period": 1,
                         "grpo.async_grpo.consume_in_order": True, "grpo.async_grpo.max_trajectory_age_steps": 2,
                         "env.math.num_train": 9})   # several epochs: the sampler position matters


def main(tokenizer_dir: str, workdir: str, steps: int, delay: float):
  from transformers import AutoTokenizer
  tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
  config = config_for(steps)
  env = FirstDigitEnv(MathConfig.from_config(config))
  policy = BigramPolicy(len(tokenizer), lr=0.5, micro_batch_size=8)
  gen = SlowGenerator(np.asarray(policy.table), tokenizer.eos_token_id, delay=delay)
  return run_grpo(config, policy=policy, generator=gen, synchronizer=FakeSynchronizer(policy, gen),
                  env=env, tokenizer=tokenizer, train_tasks=env.train, val_tasks=env.validation,
                  workdir=workdir, progress=False)


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
