"""Qwen3-MoE from the JAX trainer into CPU vLLM: same logprobs before training, and after each
refit of trained weights the canary passes (vLLM's CPU MoE path runs `qwen3_moe`; its prepacked
expert weights are repacked after each reload by `WorkerExtension._dockyard_repack_experts`)."""
import numpy as np
import pytest

from dockyard.models.tiny import make_tiny_model
from dockyard.policy import TrainBatch
from dockyard.refit.canary import RefitCanary
from dockyard.refit.synchronizer import create_weight_synchronizer

pytestmark = pytest.mark.slow


def test_moe_refit_into_cpu_vllm_passes_the_canary(config):
  from dockyard.rollout.vllm_engine import VLLMEngine
  from dockyard.trainer_jax.loss import nll_loss
  from dockyard.trainer_jax.policy import JaxPolicy
  path = make_tiny_model({"family": "qwen3_moe"})
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
