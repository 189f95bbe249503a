"""LoRA refit into a real CPU vLLM engine, both modes, each checked by the canary.

One engine (built with vLLM's LoRA support on) and one JAX LoRA policy on the tiny checkpoint:
- merge: the first sync sends every weight, later ones only the adapted projections (fewer
  bytes), and the engine matches the trainer; a sync whose tensors never reach the engine is
  caught by the canary's tracking check although the trainer moved less than its absolute bound.
- adapter: the adapters go as a PEFT directory that vLLM serves on top of the base; the engine
  matches the trainer; an adapter that is not the trained one (a stale copy) is caught the same way.
"""
import os
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file

from dockyard.policy import TrainBatch
from dockyard.refit.canary import RefitCanary, RefitCanaryError
from dockyard.refit.synchronizer import WeightSynchronizer
from dockyard.refit.transports import InProcessTransport, Transport

pytestmark = pytest.mark.slow


class DroppingTransport(Transport):
  """Streams the weights (so bytes are counted) and bumps the version, but loads nothing: the
  silent sync failure the canary must catch."""

  def __init__(self, engine):
    self.engine = engine

  def send(self, named, version):
    nbytes = sum(np.asarray(a).nbytes for _, a in named)
    self.engine.set_version(version)
    return nbytes


class StaleAdapterPolicy:
  """The policy, except that `save_adapter` ships an old snapshot of the adapters."""

  def __init__(self, policy, snapshot):
    self.policy, self.snapshot = policy, snapshot

  def save_adapter(self, path):
    shutil.copytree(self.snapshot, path)
    return 1

  def logprobs(self, batch):
    return self.policy.logprobs(batch)


def _batch(seed=0, b=8, t=24, vocab=1024):
  ids = np.random.default_rng(seed).integers(3, vocab, (b, t)).astype(np.int32)
  lm = np.ones((b, t), np.float32)
  lm[:, :4] = 0
  return TrainBatch(ids, np.ones_like(ids), lm)


def test_lora_refit_merge_and_adapter_modes_pass_the_canary(config, tiny_path, keep_engine):
  import jax
  from dockyard.rollout.vllm_engine import VLLMEngine
  from dockyard.trainer_jax import loss as losses
  from dockyard.trainer_jax.policy import JaxPolicy

  cfg = config.copy_and_resolve_references()
  cfg.policy.lora.enabled = True
  cfg.policy.lora.rank = 8
  cfg.optim.lr = 3e-3
  policy = JaxPolicy.from_hf(tiny_path, cfg, devices=jax.devices()[:1])
  engine = VLLMEngine(tiny_path, cfg.rollout, seed=0, lora_rank=8, lora_targets=cfg.policy.lora.targets)
  keep_engine(engine)

  def step(seed):
    policy.train_step(_batch(seed), losses.nll_loss)

  # --- merge -------------------------------------------------------------------------------
  canary = RefitCanary.random(engine.vocab_size, 1e-3)
  sync = WeightSynchronizer(policy, engine, InProcessTransport(engine), canary, lora_mode="merge")
  full = sync.refit()
  step(0)
  merged = sync.refit()
  print(f"merge refit: first {full['refit/bytes'] / 1e6:.2f} MB, then {merged['refit/bytes'] / 1e6:.2f} MB; "
        f"canary {merged['refit/canary/max_abs_logprob_delta']:.2e}, tracking "
        f"{merged['refit/canary/tracking_error']:.2e} (trainer moved {merged['refit/canary/trainer_change']:.2e})")
  touched = sum(a.nbytes for _, a in policy.named_weights(touched_only=True))
  assert merged["refit/bytes"] == touched < full["refit/bytes"]
  assert merged["refit/canary/tracking_error"] < 0.1

  step(1)
  canary.max_abs_logprob_delta = 10.0   # the absolute bound alone would pass a stale engine now
  dropped = WeightSynchronizer(policy, engine, DroppingTransport(engine), canary, lora_mode="merge",
                               version=engine.weight_version)
  with pytest.raises(RefitCanaryError, match="did not follow the trainer"):
    dropped.sync_weights()
  canary.max_abs_logprob_delta = 1e-3
  # a real sync puts the engine back on the trainer's weights
  WeightSynchronizer(policy, engine, InProcessTransport(engine), canary, lora_mode="merge",
                     version=engine.weight_version).refit()

  # --- adapter ------------------------------------------------------------------------------
  base = load_file(os.path.join(tiny_path, "model.safetensors"))
  engine.update_weights(base.items(), engine.weight_version + 1)   # the frozen base, unmerged
  canary = RefitCanary.random(engine.vocab_size, 1e-3)
  sync = WeightSynchronizer(policy, engine, InProcessTransport(engine), canary, lora_mode="adapter")
  first = sync.refit()
  step(2)
  second = sync.refit()
  print(f"adapter refit: {second['refit/bytes'] / 1e3:.0f} kB, canary "
        f"{second['refit/canary/max_abs_logprob_delta']:.2e}, tracking {second['refit/canary/tracking_error']:.2e}")
  assert second["refit/bytes"] == first["refit/bytes"] < merged["refit/bytes"]
  assert second["refit/canary/tracking_error"] < 0.1
  snapshot = os.path.join(sync._adapter_root, "stale")
  policy.save_adapter(snapshot)
  step(3)
  canary.max_abs_logprob_delta = 10.0
  stale = WeightSynchronizer(StaleAdapterPolicy(policy, snapshot), engine, None, canary, lora_mode="adapter",
                             version=engine.weight_version)
  with pytest.raises(RefitCanaryError, match="did not follow the trainer"):
    stale.sync_weights()
  stale.close()
  sync.close()
