"""A quantized-base LoRA policy (`policy.lora.base_quant='nf4'`) refitted into the session's CPU
vLLM engine in merge mode, through the path a run builds (`create_weight_synchronizer`): the
first sync sends every weight dequantized, later ones the adapted projections (dequantized
W + scale * B A), and the canary finds the engine on exactly the trainer's weights each time;
the engine then differs from the fp32 base by the quantization error."""
import numpy as np
import pytest

from dockyard.policy import TrainBatch
from dockyard.refit.canary import RefitCanary
from dockyard.refit.synchronizer import create_weight_synchronizer

pytestmark = pytest.mark.slow


def test_qlora_merge_refit_passes_the_canary(config, tiny_path, engine):
  import jax
  from dockyard.trainer_jax import loss as losses
  from dockyard.trainer_jax import quant
  from dockyard.trainer_jax.policy import JaxPolicy

  cfg = config.copy_and_resolve_references()
  cfg.policy.lora.update(enabled=True, rank=8, base_quant="nf4")
  cfg.optim.lr = 3e-3
  assert cfg.refit.get("lora_mode", "merge") == "merge"
  policy = JaxPolicy.from_hf(tiny_path, cfg, devices=jax.devices()[:1])
  assert quant.quantized_weights(policy.model)
  canary = RefitCanary.random(engine.vocab_size, 1e-4)
  sync = create_weight_synchronizer(cfg, policy, engine, canary=canary)
  full = sync.refit()   # every weight, the base dequantized
  assert full["refit/canary/max_abs_logprob_delta"] <= 1e-4, full
  ids = np.random.default_rng(0).integers(3, engine.vocab_size, (8, 24)).astype(np.int32)
  batch = TrainBatch(ids, np.ones_like(ids), np.ones((8, 24), np.float32))
  for _ in range(2):
    policy.train_step(batch, losses.nll_loss)
  merged = sync.refit()   # the adapted projections alone
  touched = sum(a.nbytes for _, a in policy.named_weights(touched_only=True))
  assert merged["refit/bytes"] == touched < full["refit/bytes"]
  assert merged["refit/canary/max_abs_logprob_delta"] <= 1e-4, merged
  assert merged["refit/canary/tracking_error"] < 0.1, merged
  # What the engine now serves is the quantized base's model, not the fp32 base's.
  plain = JaxPolicy.from_hf(tiny_path, config, devices=jax.devices()[:1])
  assert canary.measure(plain, engine)["max_abs_logprob_delta"] > 1e-3
  sync.close()
