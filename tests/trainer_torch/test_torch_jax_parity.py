"""Parity with the JAX backend: one HF checkpoint, one batch -> the same logprobs, loss, metrics,
gradient norm and, after one AdamW step, the same weights (HF layout, through each side's
name-map path)."""
import numpy as np
import pytest

import torch_common


@pytest.fixture(scope="module")
def both(model_path, build_policy):
  import jax

  from dockyard.trainer_jax.policy import JaxPolicy
  cfg = torch_common.make_config(micro_batch_size=4, warmup_steps=0)
  jax_policy = JaxPolicy.from_hf(model_path, cfg, devices=jax.devices()[:1])
  return build_policy(micro_batch_size=4, warmup_steps=0), jax_policy, cfg


def test_same_checkpoint_same_weights_and_logprobs(both):
  torch_policy, jax_policy, _ = both
  t, j = dict(torch_policy.named_weights()), dict(jax_policy.named_weights())
  assert list(t) == list(j)
  for name in t:
    np.testing.assert_array_equal(t[name], j[name], err_msg=name)
  batch = torch_common.make_batch(seed=5)
  lp_t, lp_j = torch_policy.logprobs(batch), jax_policy.logprobs(batch)
  assert np.all(lp_t[batch.attention_mask == 0] == 0)
  print(f"max |logprob torch - jax| = {np.abs(lp_t - lp_j).max():.2e}")
  np.testing.assert_allclose(lp_t, lp_j, rtol=0, atol=1e-4)
  batch.temperature = 0.7   # both score softmax(logits / T), the distribution sampled at T
  hot_t, hot_j = torch_policy.logprobs(batch), jax_policy.logprobs(batch)
  np.testing.assert_allclose(hot_t, hot_j, rtol=0, atol=1e-4)
  assert np.abs(hot_t - lp_t)[batch.loss_mask > 0].mean() > 0.01


def test_one_train_step_matches(both):
  from dockyard.trainer_jax import loss as jax_loss
  from dockyard.trainer_torch import loss as torch_loss
  torch_policy, jax_policy, cfg = both
  lc = torch_common.loss_config(cfg)
  batch = torch_common.make_batch(seed=6)
  batch = torch_common.with_prev(batch, torch_policy.logprobs(batch))
  m_t = torch_policy.train_step(batch, torch_loss.make_pg_loss(lc))
  m_j = jax_policy.train_step(batch, jax_loss.make_pg_loss(lc))
  assert m_t["grad_norm"] > cfg.optim.max_grad_norm   # both clip
  for k in ("loss", "pg_loss", "clip_fraction", "ratio_mean", "is_weight_mean", "grad_norm", "lr"):
    assert m_t[k] == pytest.approx(m_j[k], rel=1e-4, abs=1e-6), k
  assert torch_policy.step == jax_policy.step == 1
  t, j = dict(torch_policy.named_weights()), dict(jax_policy.named_weights())
  worst = max(float(np.abs(t[n] - j[n]).max()) for n in t)
  print(f"loss torch {m_t['loss']:.8f} jax {m_j['loss']:.8f}; grad_norm torch {m_t['grad_norm']:.7f} "
        f"jax {m_j['grad_norm']:.7f}; max |w torch - w jax| after 1 step = {worst:.2e}")
  for name in t:
    np.testing.assert_allclose(t[name], j[name], rtol=0, atol=5e-5, err_msg=f"{name} (worst {worst:.2e})")


def test_pad_token_as_a_real_token_gets_the_same_gradient(model_path):
  """HF's input embedding is nn.Embedding(padding_idx=pad_token_id), which zeroes the lookup-side
  gradient of the pad row even where the pad id is a real, attended token (SmolLM2: pad = EOS =
  <|im_end|>, in every chat prompt). The torch trainer lifts that, so both trainers give the true
  gradient: compared through one AdamW step made linear (eps >> |g|: the change is -(lr/eps) g)."""
  import jax
  import transformers

  from dockyard.trainer_jax import loss as jax_loss
  from dockyard.trainer_jax.policy import JaxPolicy
  from dockyard.trainer_torch import loss as torch_loss
  from dockyard.trainer_torch.policy import TorchPolicy
  pad = transformers.AutoConfig.from_pretrained(model_path).pad_token_id
  assert pad is not None
  cfg = torch_common.make_config(micro_batch_size=4, warmup_steps=0, lr=1e9)
  cfg.optim.eps, cfg.optim.max_grad_norm, cfg.optim.end_lr_factor = 1e5, 1e30, 1.0
  batch = torch_common.make_batch(seed=7)
  real = batch.attention_mask[:, 1:4] > 0
  batch.input_ids[:, 1:4] = np.where(real, pad, batch.input_ids[:, 1:4])   # the pad id as a real token
  batch.extras.clear()
  torch_policy = TorchPolicy.from_hf(model_path, cfg)
  jax_policy = JaxPolicy.from_hf(model_path, cfg, devices=jax.devices()[:1])
  before = dict(torch_policy.named_weights())
  torch_policy.train_step(batch, torch_loss.nll_loss)
  jax_policy.train_step(batch, jax_loss.nll_loss)
  t, j = dict(torch_policy.named_weights()), dict(jax_policy.named_weights())
  for n in t:
    d_t, d_j = t[n] - before[n], j[n] - before[n]
    scale = float(np.abs(d_j).max())
    assert scale > 0, n
    np.testing.assert_allclose(d_t, d_j, rtol=0, atol=1e-3 * scale, err_msg=n)
  emb = "model.embed_tokens.weight"
  print(f"pad row {pad}: |change| torch {np.abs(t[emb][pad] - before[emb][pad]).max():.4g}, "
        f"jax {np.abs(j[emb][pad] - before[emb][pad]).max():.4g}")


def test_token_budget_train_step_matches(model_path):
  """`optim.micro_batch_tokens` on both trainers (each plans its own micro-batches: torch on the
  exact lengths, JAX on lengths rounded to its seq_bucket): the same step as each other."""
  import jax

  from dockyard import packing
  from dockyard.trainer_jax import loss as jax_loss
  from dockyard.trainer_jax.policy import JaxPolicy
  from dockyard.trainer_torch import loss as torch_loss
  from dockyard.trainer_torch.policy import TorchPolicy
  cfg = torch_common.make_config(micro_batch_size=4, warmup_steps=0)
  cfg.optim.micro_batch_tokens, cfg.policy.seq_bucket = 48, 8
  torch_policy = TorchPolicy.from_hf(model_path, cfg)
  jax_policy = JaxPolicy.from_hf(model_path, cfg, devices=jax.devices()[:1])
  batch = torch_common.make_batch(seed=8)
  assert len(packing.token_budget_groups(packing.seq_lengths(batch), 48)) >= 3
  assert len({n for _, _, n in jax_policy._plan_budget(batch)}) >= 2
  np.testing.assert_allclose(torch_policy.logprobs(batch), jax_policy.logprobs(batch), rtol=0, atol=1e-4)
  lc = torch_common.loss_config(cfg)
  m_t = torch_policy.train_step(batch, torch_loss.make_pg_loss(lc))
  m_j = jax_policy.train_step(batch, jax_loss.make_pg_loss(lc))
  for k in ("loss", "pg_loss", "clip_fraction", "ratio_mean", "is_weight_mean", "grad_norm", "lr"):
    assert m_t[k] == pytest.approx(m_j[k], rel=1e-4, abs=1e-6), k
  t, j = dict(torch_policy.named_weights()), dict(jax_policy.named_weights())
  for name in t:
    np.testing.assert_allclose(t[name], j[name], rtol=0, atol=5e-5, err_msg=name)
