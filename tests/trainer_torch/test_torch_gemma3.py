"""Gemma 3 (text) through the torch trainer (transformers' Gemma3ForCausalLM under FSDP2): the
same logprobs as the JAX trainer on right-padded rows longer than the sliding window (and packed
rows as unpacked ones), and after one GRPO step the same metrics and weights (HF layout, through
each side's name-map path)."""
import numpy as np
import pytest

import torch_common


def test_gemma3_torch_matches_jax():
  import jax

  from dockyard.models.tiny import make_tiny_model
  from dockyard.trainer_jax import loss as jax_loss
  from dockyard.trainer_jax.policy import JaxPolicy
  from dockyard.trainer_torch import loss as torch_loss
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

  lc = torch_common.loss_config(cfg)
  batch = torch_common.with_prev(batch, lp_t)
  m_t = torch_policy.train_step(batch, torch_loss.make_pg_loss(lc))
  m_j = jax_policy.train_step(batch, jax_loss.make_pg_loss(lc))
  for k in ("loss", "pg_loss", "grad_norm"):
    assert m_t[k] == pytest.approx(m_j[k], rel=1e-4, abs=1e-6), k
  t, j = dict(torch_policy.named_weights()), dict(jax_policy.named_weights())
  assert list(t) == list(j) and "model.layers.1.pre_feedforward_layernorm.weight" in t
  worst = max(float(np.abs(t[n] - j[n]).max()) for n in t)
  print(f"max |w torch - w jax| after 1 step = {worst:.2e}")
  assert worst <= 5e-5
