"""The SWE end-to-end test's session fixture: the real parts the launcher builds (local Ray, the
local sandbox executor fleet, CPU vLLM as a Ray actor, the JAX trainer, the weight synchronizer with
its canary), built once through `dockyard.runner`'s own helpers and torn down at the end."""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import pytest

from configs import swe


@dataclasses.dataclass
class Parts:
  config: Any
  tokenizer: Any
  env: Any
  train_tasks: list
  policy: Any
  generator: Any
  synchronizer: Any


def e2e_config():
  """The tiny default, shortened: sync GRPO, no validation or checkpoints, pass_rate reward (a patch
  that applies keeps PASS_TO_PASS passing, so groups differ before anything resolves)."""
  config = swe.get_config("sync")
  config.grpo.max_num_steps = 2
  config.optim.warmup_steps = 1             # the schedule needs decay steps (= max_num_steps) > warmup
  config.grpo.num_prompts_per_step = 2
  config.grpo.num_generations_per_prompt = 8
  # T=1: after the SFT the model is peaked; at the default 0.7 each group came out flat (one task
  # always right, one always wrong); T=1 sampling varies the patches within a group.
  config.rollout.temperature = 1.0
  config.grpo.val_at_start = False
  config.grpo.val_period = 0
  config.grpo.sft_warmup.steps = 0          # the test runs its own short SFT on two tasks
  config.env.code.reward = "pass_rate"
  config.checkpoint.enabled = False
  config.logging.tensorboard = False
  config.logging.png_curve = False
  config.rollout.max_model_len = 1024
  return config


@pytest.fixture(scope="module")
def parts():
  from dockyard import policy_factory, ray_utils, runner
  from dockyard.refit.synchronizer import create_weight_synchronizer
  from dockyard.rollout.fleet import RolloutFleet
  import transformers

  config = e2e_config()
  with contextlib.ExitStack() as stack:
    # Ray stays up for other rooms' session fixtures; this module's actors (vLLM engine, sandbox
    # executor) are shut down at its end so they do not hold the CPUs later fleets reserve.
    ray_utils.init_ray(config.run.ray_address)
    model_path = runner.resolve_model(config)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_path)
    env, train, _, _ = runner.build_env(config, tokenizer, stack)
    policy = policy_factory.make_policy(config, model_path)
    generator = RolloutFleet(config, model_path)
    stack.callback(generator.shutdown)
    synchronizer = create_weight_synchronizer(config, policy, generator)
    yield Parts(config, tokenizer, env, train, policy, generator, synchronizer)
