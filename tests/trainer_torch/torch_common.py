"""Shared by the trainer_torch tests and their torchrun worker: the config, the model, a batch."""
from __future__ import annotations

import numpy as np

from configs import swe
from dockyard.grpo.loss_spec import LossConfig
from dockyard.policy import TrainBatch

# Small enough that a torchrun pair starts and trains in seconds; head_dim 32 as vLLM's CPU needs.
SPEC = dict(family="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, vocab_size=512, tie_word_embeddings=True,
            max_position_embeddings=512)


def make_config(micro_batch_size: int = 8, warmup_steps: int = 1, lr: float = 1e-3,
                dtype: str = "float32", remat: bool = False):
  cfg = swe.get_config("torch")
  cfg.policy.dtype = dtype
  cfg.policy.remat = remat
  cfg.optim.micro_batch_size = micro_batch_size
  cfg.optim.warmup_steps = warmup_steps
  cfg.optim.lr = lr
  cfg.optim.end_lr_factor = 0.1        # a schedule that decays (the tiny default is constant)
  cfg.optim.max_grad_norm = 0.5        # small enough that clipping is exercised
  cfg.grpo.max_num_steps = 8
  cfg.policy.tiny = SPEC
  cfg.policy.max_seq_len = SPEC["max_position_embeddings"]
  return cfg


def loss_config(cfg) -> LossConfig:
  return LossConfig.from_config(cfg)


def make_batch(seed: int = 0, b: int = 7, t: int = 20, vocab: int = 512) -> TrainBatch:
  """Right-padded rows of different lengths, a prompt part without loss, one row with no loss
  tokens at all, and extras from a perturbed policy (ratios != 1, IS weights != 1)."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(3, vocab, (b, t)).astype(np.int32)
  am = np.zeros((b, t), np.int32)
  lm = np.zeros((b, t), np.float32)
  for i in range(b):
    length = int(rng.integers(t // 2, t + 1))
    prompt = int(rng.integers(2, t // 2))
    am[i, :length] = 1
    ids[i, length:] = 0
    if i != b - 1:
      lm[i, prompt:length] = 1
  base = -rng.uniform(3.0, 8.0, (b, t)).astype(np.float32)
  extras = dict(
      advantages=rng.normal(size=b).astype(np.float32),
      prev_logprobs=base,
      generation_logprobs=(base + rng.normal(scale=0.3, size=(b, t))).astype(np.float32),
  )
  return TrainBatch(ids, am, lm, extras)


def with_prev(batch: TrainBatch, logprobs: np.ndarray, seed: int = 1) -> TrainBatch:
  """The batch with prev_logprobs = the policy's own (perturbed) logprobs, as a trainer recomputes."""
  rng = np.random.default_rng(seed)
  prev = (logprobs + rng.normal(scale=0.1, size=logprobs.shape)).astype(np.float32)
  return TrainBatch(batch.input_ids, batch.attention_mask, batch.loss_mask,
                    {**batch.extras, "prev_logprobs": prev}, batch.temperature)


def pg_step_on_both(torch_policy, jax_policy, cfg, batch: TrainBatch, logprobs: np.ndarray,
                    keys: tuple[str, ...]) -> tuple[dict, dict]:
  """One clipped-PG step on each trainer from `batch` (prev logprobs from `logprobs`, `with_prev`):
  the metrics `keys` agree (rel 1e-4), and so do the updated weights, name for name (<= 5e-5).
  Returns the torch step's metrics and weights (HF name -> array)."""
  import pytest

  from dockyard.trainer_jax import loss as jax_loss
  from dockyard.trainer_torch import loss as torch_loss
  lc = loss_config(cfg)
  batch = with_prev(batch, logprobs)
  m_t = torch_policy.train_step(batch, torch_loss.make_pg_loss(lc))
  m_j = jax_policy.train_step(batch, jax_loss.make_pg_loss(lc))
  print({k: (m_t[k], m_j[k]) for k in keys})
  for k in keys:
    assert m_t[k] == pytest.approx(m_j[k], rel=1e-4, abs=1e-6), k
  t, j = dict(torch_policy.named_weights()), dict(jax_policy.named_weights())
  assert list(t) == list(j)
  worst = max(float(np.abs(t[n] - j[n]).max()) for n in t)
  print(f"max |w torch - w jax| after 1 step = {worst:.2e}")
  assert worst <= 5e-5
  return m_t, t
