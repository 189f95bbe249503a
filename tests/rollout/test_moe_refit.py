"""Qwen3-MoE from the JAX trainer into CPU vLLM: same logprobs before training, and after each
refit of trained weights the canary passes (vLLM's CPU MoE path runs `qwen3_moe`; its prepacked
expert weights are repacked after each reload by `WorkerExtension._dockyard_repack_experts`).

It runs in a child process: vLLM initializes its process-global parallel state once, with the
expert-parallel group only when the first engine of the process is an MoE model, so this engine
cannot share a process with the session's dense engine (tests/rollout/conftest.py)."""
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


def test_moe_refit_into_cpu_vllm_passes_the_canary():
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
             VLLM_ENABLE_V1_MULTIPROCESSING="0")
  r = subprocess.run([sys.executable, os.path.abspath(__file__)], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
  assert r.stdout.strip().splitlines()[-1] == "moe refit: ok"


def _moe_refit():
  from configs import swe
  from dockyard.rollout.vllm_engine import VLLMEngine
  from dockyard.trainer_jax.loss import nll_loss
  from dockyard.trainer_jax.policy import JaxPolicy
  path = make_tiny_model({"family": "qwen3_moe"})
  config = swe.get_config("tiny")
  config.rollout.max_model_len = 512   # as tests/rollout/conftest.py's config
  engine = VLLMEngine(path, config.rollout, seed=0)
  policy = JaxPolicy.from_hf(path, config)
  assert policy.model.config.is_moe
  canary = RefitCanary.random(engine.vocab_size, float(config.refit.canary.max_abs_logprob_delta))
  # Before any training both sides run the checkpoint: vLLM's fused MoE equals the NNX decoder's.
  assert canary.measure(policy, engine)["max_abs_logprob_delta"] <= 1e-5
  sync = create_weight_synchronizer(config, policy, engine, canary=canary)
  policy.set_lr(1e-2)
  ids = np.random.default_rng(0).integers(0, policy.model.config.vocab_size, (8, 32)).astype(np.int32)
  batch = TrainBatch(ids, np.ones_like(ids), np.ones_like(ids))
  for version in (1, 2):   # the second refit reloads over an engine that was already refitted
    for _ in range(2):
      policy.train_step(batch, nll_loss)
    assert canary.measure(policy, engine)["max_abs_logprob_delta"] > 0.05   # the engine is stale
    metrics = sync.refit()
    assert engine.weight_version == version
    assert metrics["refit/canary/max_abs_logprob_delta"] <= 1e-5, metrics
  print("moe refit: ok", flush=True)


if __name__ == "__main__":
  _moe_refit()
