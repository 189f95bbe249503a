"""Gemma 3 (text) from the JAX trainer into CPU vLLM: the same logprobs before training (on
prompts longer than the sliding window), and after each refit of trained weights the canary
passes (the name map's Gemma entries, the pre/post-feedforward norms included, reach vLLM).

It runs in a child process, as tests/rollout/test_moe_refit.py does: a second model family in
the session's process would share vLLM's process-global state with the session's engine."""
import os
import subprocess
import sys

import numpy as np
import pytest

from dockyard.models.tiny import make_tiny_model
from dockyard.policy import TrainBatch
from dockyard.refit.canary import RefitCanary
from dockyard.refit.synchronizer import create_weight_synchronizer

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_gemma3_refit_into_cpu_vllm_passes_the_canary():
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
             VLLM_ENABLE_V1_MULTIPROCESSING="0")
  r = subprocess.run([sys.executable, os.path.abspath(__file__)], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
  assert r.stdout.strip().splitlines()[-1] == "gemma3 refit: ok"


def _gemma3_refit():
  from configs import swe
  from dockyard.rollout.vllm_engine import VLLMEngine
  from dockyard.trainer_jax.loss import nll_loss
  from dockyard.trainer_jax.policy import JaxPolicy
  path = make_tiny_model({"family": "gemma3"})
  config = swe.get_config("tiny")
  config.rollout.max_model_len = 512   # as tests/rollout/conftest.py's config
  engine = VLLMEngine(path, config.rollout, seed=0)
  policy = JaxPolicy.from_hf(path, config)
  c = policy.model.config
  assert c.family == "gemma3" and c.sliding_layers and c.sliding_window < 32
  # Prompts of 32 tokens, twice the window: the sliding layers' window shapes what vLLM scores.
  canary = RefitCanary.random(engine.vocab_size, float(config.refit.canary.max_abs_logprob_delta), length=32)
  before = canary.measure(policy, engine)["max_abs_logprob_delta"]
  print(f"gemma3 before training: max |logprob jax - vllm| = {before:.2e}", flush=True)
  assert before <= 1e-4
  sync = create_weight_synchronizer(config, policy, engine, canary=canary)
  policy.set_lr(1e-2)
  ids = np.random.default_rng(0).integers(0, c.vocab_size, (8, 48)).astype(np.int32)
  batch = TrainBatch(ids, np.ones_like(ids), np.ones_like(ids))
  for version in (1, 2):
    for _ in range(2):
      policy.train_step(batch, nll_loss)
    assert canary.measure(policy, engine)["max_abs_logprob_delta"] > 0.05   # the engine is stale
    metrics = sync.refit()
    assert engine.weight_version == version
    delta = metrics["refit/canary/max_abs_logprob_delta"]
    print(f"gemma3 refit {version}: max |logprob jax - vllm| = {delta:.2e}", flush=True)
    assert delta <= 1e-4, metrics
  print("gemma3 refit: ok", flush=True)


if __name__ == "__main__":
  _gemma3_refit()
