"""The clipped policy-gradient loss and the SFT NLL loss in JAX, following `dockyard.grpo.loss_spec`
exactly (as `dockyard.trainer_torch.loss` does in torch; each backend's loss sits beside its trainer).

Both are `dockyard.policy.LossFn`s: `fn(logprobs [B,T], loss_mask [B,T], extras) -> (loss,
metrics)`, traceable under `jax.jit`/`jax.grad`. Only `logprobs` carries gradient: prev,
generation and reference logprobs and the importance weights are wrapped in `stop_gradient`.
"""
from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp

from dockyard.grpo.loss_spec import LossConfig, check_extras


def _totals(m: jnp.ndarray, n_b: jnp.ndarray, extras: Mapping[str, Any]):
  # The trainer passes whole-batch totals when it micro-batches; alone, a batch is its own whole.
  total_tokens = extras["total_tokens"] if "total_tokens" in extras else m.sum()
  total_sequences = extras["total_sequences"] if "total_sequences" in extras else (n_b > 0).sum()
  return (jnp.maximum(jnp.asarray(total_tokens, jnp.float32), 1.0),
          jnp.maximum(jnp.asarray(total_sequences, jnp.float32), 1.0))


def clipped_pg_loss(logprobs, loss_mask, extras: Mapping[str, Any], cfg: LossConfig):
  """See `loss_spec.clipped_pg_loss`; same math, same metrics."""
  check_extras(extras, cfg)
  sg = jax.lax.stop_gradient
  lp = logprobs.astype(jnp.float32)
  m = jnp.asarray(loss_mask, jnp.float32)
  # absent: this is the batch's one optimizer step, so prev is the policy now, detached
  prev = sg(jnp.asarray(extras["prev_logprobs"], jnp.float32) if "prev_logprobs" in extras else lp)
  adv = sg(jnp.asarray(extras["advantages"], jnp.float32))
  if adv.ndim == 1:
    adv = adv[:, None]
  n_b = m.sum(-1)
  total_tokens, total_sequences = _totals(m, n_b, extras)

  log_ratio = (lp - prev) * m
  if cfg.ratio_level == "sequence":
    seq_log_ratio = log_ratio.sum(-1) / jnp.maximum(n_b, 1.0)
    ratio = jnp.broadcast_to(jnp.exp(seq_log_ratio)[:, None], lp.shape)
  else:
    ratio = jnp.exp(log_ratio)
  clipped = jnp.clip(ratio, 1.0 - cfg.ratio_clip_min, 1.0 + cfg.ratio_clip_max)
  loss1, loss2 = -adv * ratio, -adv * clipped
  pg = jnp.maximum(loss1, loss2)
  clip_active = (loss2 > loss1).astype(jnp.float32)
  dual_active = jnp.zeros_like(pg)
  if cfg.ratio_clip_c > 1.0:
    loss3 = -adv * cfg.ratio_clip_c
    dual_active = ((adv < 0) & (loss3 < pg)).astype(jnp.float32)
    pg = jnp.where(adv < 0, jnp.minimum(pg, loss3), pg)

  kl = jnp.zeros_like(pg)
  if cfg.reference_policy_kl_penalty != 0:
    d = (sg(jnp.asarray(extras["reference_logprobs"], jnp.float32)) - lp) * m
    kl = jnp.exp(d) - d - 1.0

  w = jnp.ones_like(pg)
  if cfg.use_importance_sampling_correction:
    gen = jnp.asarray(extras["generation_logprobs"], jnp.float32)
    w = sg(jnp.minimum(jnp.exp((prev - gen) * m), cfg.truncated_importance_sampling_ratio))

  per_token = w * (pg + cfg.reference_policy_kl_penalty * kl)
  if cfg.normalization == "constant":
    loss = (per_token * m).sum() / (total_sequences * cfg.max_completion_tokens)
  elif cfg.normalization == "sequence":
    loss = ((per_token * m).sum(-1) / jnp.maximum(n_b, 1.0)).sum() / total_sequences
  else:
    loss = (per_token * m).sum() / total_tokens

  def tok_mean(x):
    return sg((x * m).sum() / total_tokens)

  metrics = dict(
      loss=sg(loss), pg_loss=tok_mean(w * pg), kl=tok_mean(kl),
      clip_fraction=tok_mean(clip_active), dual_clip_fraction=tok_mean(dual_active),
      ratio_mean=tok_mean(ratio), is_weight_mean=tok_mean(w))
  if "generation_logprobs" in extras:
    diff = (prev - jnp.asarray(extras["generation_logprobs"], jnp.float32)) * m
    metrics.update(is_ratio_mean=tok_mean(jnp.exp(diff)), is_logprob_abs_diff_mean=tok_mean(jnp.abs(diff)))
    if cfg.use_importance_sampling_correction:
      metrics["is_truncated_fraction"] = tok_mean(
          (jnp.exp(diff) > cfg.truncated_importance_sampling_ratio).astype(jnp.float32))
  return loss, metrics


def make_pg_loss(cfg: LossConfig):
  """A `LossFn` closed over `cfg` (static: its branches are chosen at trace time)."""
  def loss_fn(logprobs, loss_mask, extras):
    return clipped_pg_loss(logprobs, loss_mask, extras, cfg)
  return loss_fn


def nll_loss(logprobs, loss_mask, extras: Mapping[str, Any]):
  """Masked NLL per token (SFT warm start); see `loss_spec.nll_loss`."""
  m = jnp.asarray(loss_mask, jnp.float32)
  total_tokens = _totals(m, m.sum(-1), extras)[0]
  loss = -(logprobs.astype(jnp.float32) * m).sum() / total_tokens
  return loss, dict(loss=jax.lax.stop_gradient(loss), nll=jax.lax.stop_gradient(loss))


def topk_kl_loss(logprobs, loss_mask, extras: Mapping[str, Any], weights):
  """The top-k reverse KL to the teachers, per `dockyard.distill.topk_kl_loss` (the spec). The
  gradient flows through extras['topk_logprobs'] (the trainer's, per the top-k contract of
  `dockyard.policy`); `logprobs` is not read."""
  from dockyard.distill import REST_FLOOR
  del logprobs
  m = jnp.asarray(loss_mask, jnp.float32)
  total_tokens = _totals(m, m.sum(-1), extras)[0]
  student = extras["topk_logprobs"].astype(jnp.float32)
  teacher = jax.lax.stop_gradient(jnp.asarray(extras["teacher_topk_logprobs"], jnp.float32))
  k = student.shape[-1] // len(weights)
  rows = extras.get("teacher_weights")   # [B, M], each row's teacher weights (the spec's)
  rows = (jnp.asarray(rows, jnp.float32) if rows is not None
          else jnp.broadcast_to(jnp.asarray(weights, jnp.float32), (m.shape[0], len(weights))))
  per_token, mass0 = jnp.zeros_like(m), None
  for i in range(len(weights)):
    s, q = student[..., i * k:(i + 1) * k], teacher[..., i * k:(i + 1) * k]
    ps, pq = jnp.exp(s), jnp.exp(q)
    rest_s = jnp.maximum(1.0 - ps.sum(-1), REST_FLOOR)
    rest_q = jnp.maximum(1.0 - pq.sum(-1), REST_FLOOR)
    per_token = per_token + rows[:, i, None] * ((ps * (s - q)).sum(-1) + rest_s * (jnp.log(rest_s) - jnp.log(rest_q)))
    mass0 = ps.sum(-1) if mass0 is None else mass0
  loss = (per_token * m).sum() / total_tokens
  sg = jax.lax.stop_gradient
  return loss, dict(topk_kl=sg(loss), topk_student_mass=sg((mass0 * m).sum() / total_tokens))


def make_topk_kl_loss(weights):
  """A `LossFn` closed over the teachers' weights (a tuple: its length is the teacher count)."""
  weights = tuple(float(w) for w in weights)

  def loss_fn(logprobs, loss_mask, extras):
    return topk_kl_loss(logprobs, loss_mask, extras, weights)
  return loss_fn
