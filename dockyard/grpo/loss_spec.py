"""The clipped policy-gradient loss, written once in NumPy as the spec both trainers are tested against.

This file is the definition; `dockyard.trainer_jax.loss` and `dockyard.trainer_torch.loss` must
agree with it on any input. It has no framework dependency beyond NumPy so that either backend
imports it (for `LossConfig` and `check_extras`) and the tests compare both against it.

Shapes and alignment follow `dockyard.policy.TrainBatch`: every per-token array is [B, T] and
entry t refers to the prediction OF token t (so `loss_mask` is 1 on completion tokens).

The three kinds of logprobs (all per token, [B, T], only read where loss_mask is 1):
  logprobs            the policy being trained, now (the only term that carries gradient).
  prev_logprobs       the same policy at the start of this optimizer step, recomputed by the
                      trainer on the batch; the PPO ratio is exp(logprobs - prev_logprobs). On the
                      first epoch over a batch it equals `logprobs` detached (ratio 1, gradient of
                      the ratio = the ordinary policy gradient), so it may be left out: absent,
                      prev_logprobs := logprobs detached (the step that takes ONE optimizer step
                      per batch skips a whole forward pass; TRL does the same when it trains each
                      batch once).
  generation_logprobs what the inference engine's sampler reported when it produced the tokens
                      (possibly older weights under async GRPO, and a different numeric stack).
  reference_logprobs  the frozen reference policy, for the KL penalty (absent when its
                      coefficient is 0: the reference forward is skipped).

Per token, with A the advantage (per sequence [B] or per token [B, T]):
  r      = exp(logprobs - prev_logprobs)                         (ratio_level='token')
  r      = exp(masked mean over the sequence of (logprobs - prev))  (ratio_level='sequence', GSPO)
  pg     = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))
  pg     = min(pg, -A c)  where A < 0, when ratio_clip_c > 1     (dual clip)
  kl     = beta * (exp(ref - logprobs) - (ref - logprobs) - 1)   (k3 estimator; 0 when beta == 0)
  w      = min(exp(prev_logprobs - generation_logprobs), cap)    (IS correction, no gradient;
                                                                  1 when the correction is off)
  l      = w * (pg + kl)

Normalization into the scalar loss, independent of the ratio level (N_tok = total_tokens,
N_seq = total_sequences of the WHOLE batch, taken from extras when the trainer micro-batches, so
that micro-batch losses sum exactly to the full-batch loss; see `dockyard.policy.LossFn`):
  token:     sum_{b,t} l m / N_tok                      (batch token mean; DAPO; verl 'token-mean',
                                                         TRL loss_type='dapo')
  sequence:  sum_b [ sum_t l m / n_b ] / N_seq          (n_b: loss tokens of row b; the original
                                                         GRPO, DeepSeekMath eq. 3; verl
                                                         'seq-mean-token-mean', TRL 'grpo')
  constant:  sum_{b,t} l m / (N_seq * max_completion_tokens)   (Dr. GRPO: a constant normalizer,
                                                         so long and short answers are weighted
                                                         alike; verl 'seq-mean-token-sum-norm',
                                                         TRL 'dr_grpo')
Every (ratio_level, normalization) pair is allowed: token + sequence is DeepSeekMath's GRPO,
sequence + sequence is GSPO, token + token is DAPO, and either level + constant is Dr. GRPO.

Metrics follow the same summable normalization (token metrics / N_tok): pg_loss, kl,
clip_fraction (tokens whose clipped branch is active), dual_clip_fraction, ratio_mean,
is_weight_mean; and, when generation_logprobs are in the batch, the trainer-vs-sampler mismatch
before truncation: is_ratio_mean (exp(prev - gen)), is_logprob_abs_diff_mean (|prev - gen|) and
is_truncated_fraction (tokens with exp(prev - gen) > cap, when the correction is on). They are
exact under micro-batching because they are sums.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np


RATIO_LEVELS = ("token", "sequence")
NORMALIZATIONS = ("token", "sequence", "constant")


@dataclasses.dataclass(frozen=True)
class LossConfig:
  """The options of the clipped-PG loss; mirrors `config.loss_fn` (+ the completion budget)."""
  ratio_clip_min: float = 0.2
  ratio_clip_max: float = 0.28
  ratio_clip_c: float = 3.0
  reference_policy_kl_penalty: float = 0.0
  use_importance_sampling_correction: bool = True
  truncated_importance_sampling_ratio: float = 2.0
  ratio_level: str = "token"                 # token | sequence (GSPO)
  normalization: str = "token"               # token | sequence | constant (Dr. GRPO)
  max_completion_tokens: int = 0             # Dr. GRPO's constant; rollout.max_new_tokens

  def __post_init__(self):
    if self.ratio_level not in RATIO_LEVELS:
      raise ValueError(f"loss_fn.ratio_level must be one of {RATIO_LEVELS}, got {self.ratio_level!r}")
    if self.normalization not in NORMALIZATIONS:
      raise ValueError(f"loss_fn.normalization must be one of {NORMALIZATIONS}, got "
                       f"{self.normalization!r}")
    if self.ratio_clip_min < 0 or self.ratio_clip_max < 0:
      raise ValueError(f"loss_fn.ratio_clip_min/max must be >= 0, got {self.ratio_clip_min}, "
                       f"{self.ratio_clip_max}")
    if self.use_importance_sampling_correction and self.truncated_importance_sampling_ratio <= 0:
      raise ValueError("loss_fn.truncated_importance_sampling_ratio must be > 0, got "
                       f"{self.truncated_importance_sampling_ratio}")
    if self.normalization == "constant" and self.max_completion_tokens <= 0:
      raise ValueError("loss_fn.normalization='constant' needs max_completion_tokens > 0 "
                       "(rollout.max_new_tokens)")

  @classmethod
  def from_config(cls, config) -> "LossConfig":
    """From the experiment config: `config.loss_fn.*` and `config.rollout.max_new_tokens`."""
    loss = config.loss_fn
    return cls(
        ratio_clip_min=float(loss.ratio_clip_min), ratio_clip_max=float(loss.ratio_clip_max),
        ratio_clip_c=float(loss.ratio_clip_c),
        reference_policy_kl_penalty=float(loss.reference_policy_kl_penalty),
        use_importance_sampling_correction=bool(loss.use_importance_sampling_correction),
        truncated_importance_sampling_ratio=float(loss.truncated_importance_sampling_ratio),
        ratio_level=str(loss.ratio_level), normalization=str(loss.normalization),
        max_completion_tokens=int(config.rollout.max_new_tokens))


REQUIRED_EXTRAS = ("advantages",)   # prev_logprobs: optional, see the module docstring


def check_extras(extras: Mapping[str, Any], cfg: LossConfig) -> None:
  """Names the missing extra instead of failing with a KeyError deep inside a trace."""
  need = list(REQUIRED_EXTRAS)
  if cfg.use_importance_sampling_correction:
    need.append("generation_logprobs")
  if cfg.reference_policy_kl_penalty != 0:
    need.append("reference_logprobs")
  missing = [k for k in need if k not in extras]
  if missing:
    raise KeyError(f"clipped-PG loss: batch.extras lacks {missing} (has {sorted(extras)})")


def clipped_pg_loss(logprobs: np.ndarray, loss_mask: np.ndarray, extras: Mapping[str, np.ndarray],
                    cfg: LossConfig) -> tuple[float, dict[str, float]]:
  """The reference loss: (scalar loss, summable metrics). See the module docstring."""
  check_extras(extras, cfg)
  lp = np.asarray(logprobs, np.float64)
  m = np.asarray(loss_mask, np.float64)
  prev = np.asarray(extras["prev_logprobs"], np.float64) if "prev_logprobs" in extras else lp
  adv = np.asarray(extras["advantages"], np.float64)
  if adv.ndim == 1:
    adv = adv[:, None]
  n_b = m.sum(-1)                                   # loss tokens per row
  total_tokens = float(extras.get("total_tokens", m.sum()))
  total_sequences = float(extras.get("total_sequences", (n_b > 0).sum()))
  total_tokens, total_sequences = max(total_tokens, 1.0), max(total_sequences, 1.0)

  log_ratio = (lp - prev) * m
  if cfg.ratio_level == "sequence":
    seq_log_ratio = log_ratio.sum(-1) / np.maximum(n_b, 1.0)
    ratio = np.broadcast_to(np.exp(seq_log_ratio)[:, None], lp.shape)
  else:
    ratio = np.exp(log_ratio)
  clipped = np.clip(ratio, 1.0 - cfg.ratio_clip_min, 1.0 + cfg.ratio_clip_max)
  loss1, loss2 = -adv * ratio, -adv * clipped
  pg = np.maximum(loss1, loss2)
  clip_active = (loss2 > loss1).astype(np.float64)
  dual_active = np.zeros_like(pg)
  if cfg.ratio_clip_c > 1.0:
    loss3 = -adv * cfg.ratio_clip_c
    dual_active = ((adv < 0) & (loss3 < pg)).astype(np.float64)
    pg = np.where(adv < 0, np.minimum(pg, loss3), pg)

  kl = np.zeros_like(pg)
  if cfg.reference_policy_kl_penalty != 0:
    d = (np.asarray(extras["reference_logprobs"], np.float64) - lp) * m
    kl = np.exp(d) - d - 1.0

  w = np.ones_like(pg)
  if cfg.use_importance_sampling_correction:
    gen = np.asarray(extras["generation_logprobs"], np.float64)
    w = np.minimum(np.exp((prev - gen) * m), cfg.truncated_importance_sampling_ratio)

  per_token = w * (pg + cfg.reference_policy_kl_penalty * kl)
  if cfg.normalization == "constant":
    loss = (per_token * m).sum() / (total_sequences * cfg.max_completion_tokens)
  elif cfg.normalization == "sequence":
    loss = ((per_token * m).sum(-1) / np.maximum(n_b, 1.0)).sum() / total_sequences
  else:
    loss = (per_token * m).sum() / total_tokens

  def tok_mean(x):
    return float((x * m).sum() / total_tokens)

  metrics = dict(
      loss=float(loss), pg_loss=tok_mean(w * pg), kl=tok_mean(kl),
      clip_fraction=tok_mean(clip_active), dual_clip_fraction=tok_mean(dual_active),
      ratio_mean=tok_mean(ratio), is_weight_mean=tok_mean(w))
  if "generation_logprobs" in extras:
    diff = (prev - np.asarray(extras["generation_logprobs"], np.float64)) * m
    metrics.update(is_ratio_mean=tok_mean(np.exp(diff)), is_logprob_abs_diff_mean=tok_mean(np.abs(diff)))
    if cfg.use_importance_sampling_correction:
      metrics["is_truncated_fraction"] = tok_mean(np.exp(diff) > cfg.truncated_importance_sampling_ratio)
  return float(loss), metrics


def nll_loss(logprobs: np.ndarray, loss_mask: np.ndarray,
             extras: Mapping[str, np.ndarray]) -> tuple[float, dict[str, float]]:
  """Masked negative log-likelihood per token (SFT warm start): -sum(lp m) / total_tokens."""
  lp = np.asarray(logprobs, np.float64)
  m = np.asarray(loss_mask, np.float64)
  total_tokens = max(float(extras.get("total_tokens", m.sum())), 1.0)
  loss = -(lp * m).sum() / total_tokens
  return float(loss), dict(loss=float(loss), nll=float(loss))


def random_batch(rng: np.random.Generator, b: int = 5, t: int = 9, per_token_adv: bool = False):
  """Random inputs for checking an implementation against this spec: (logprobs, mask, extras)
  with ragged masks (prompt zeros on the left, padding on the right) and one row without loss."""
  mask = np.zeros((b, t), np.float32)
  for i in range(b - 1):
    start = rng.integers(1, 4)
    mask[i, start:rng.integers(start + 1, t + 1)] = 1
  lp = -rng.uniform(0.1, 3.0, (b, t)).astype(np.float32)
  extras = dict(
      advantages=rng.normal(size=(b, t) if per_token_adv else (b,)).astype(np.float32),
      prev_logprobs=(lp + rng.normal(scale=0.3, size=(b, t))).astype(np.float32),
      generation_logprobs=(lp + rng.normal(scale=0.5, size=(b, t))).astype(np.float32),
      reference_logprobs=(lp + rng.normal(scale=0.4, size=(b, t))).astype(np.float32),
  )
  return lp, mask, extras
