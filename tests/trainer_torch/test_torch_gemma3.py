"""Gemma 3 (text) through the torch trainer (transformers' Gemma3ForCausalLM under FSDP2): the
same logprobs as the JAX trainer on right-padded rows longer than the sliding window (and packed
rows as unpacked ones), and after one GRPO step the same metrics and weights (HF layout, through
each side's name-map path)."""
import numpy as np

import torch_common


def test_gemma3_torch_matches_jax():
  import jax

  from dockyard.models.tiny import make_tiny_model
  from dockyard.trainer_jax.policy import JaxPolicy
  from dockyard.trainer_torch.policy import TorchPolicy
  path = make_tiny_model({"family": "gemma3"})   # layer 0 slides over 16 keys, layer 1 is full
  cfg = torch_common.make_config(micro_batch_size=4, warmup_steps=0)
  torch_policy = TorchPolicy.from_hf(path, cfg)
  jax_policy = JaxPolicy.from_hf(path, cfg, devices=jax.devices()[:1])
  assert torch_policy.model_config.sliding_layers == (0,) and torch_policy.model_config.sliding_window == 16
  batch = torch_common.make_batch(seed=5, t=40, vocab=1024)
  lp_t, lp_j = torch_policy.logprobs(batch), jax_policy.logprobs(batch)
  print(f"max |logprob torch - jax| = {np.abs(lp_t - lp_j).max():.2e}")
  np.testing.assert_allclose(lp_t, lp_j, rtol=0, atol=1e-4)
  # Packed rows (transformers builds the sliding mask per segment from the restarting positions).
  packed_cfg = torch_common.make_config(micro_batch_size=2, warmup_steps=0)
  packed_cfg.policy.packing_row_tokens = 128
  lp_packed = TorchPolicy.from_hf(path, packed_cfg).logprobs(batch)
  np.testing.assert_allclose(lp_packed, lp_t, rtol=0, atol=1e-5)

  _, t = torch_common.pg_step_on_both(torch_policy, jax_policy, cfg, batch, lp_t,
                                      ("loss", "pg_loss", "grad_norm"))
  assert "model.layers.1.pre_feedforward_layernorm.weight" in t
