"""The clipped policy-gradient loss and the SFT NLL loss in torch, following `dockyard.grpo.loss_spec`
exactly (as `dockyard.trainer_jax.loss` does in JAX; each backend's loss sits beside its trainer).

Both are `dockyard.policy.LossFn`s: `fn(logprobs [B,T], loss_mask [B,T], extras) -> (loss,
metrics)` on torch tensors. Only `logprobs` carries gradient: prev, generation and reference
logprobs, advantages and the importance weights are detached. Whole-batch `total_tokens` /
`total_sequences` in extras (the micro-batching contract of `dockyard.policy`) set the
normalizers, so micro-batch losses sum exactly to the full-batch loss.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from dockyard.grpo.loss_spec import LossConfig, check_extras


def _f32(x, like: torch.Tensor) -> torch.Tensor:
  return torch.as_tensor(x, dtype=torch.float32, device=like.device).detach()


def _totals(m: torch.Tensor, n_b: torch.Tensor, extras: Mapping[str, Any]):
  # Alone (no trainer totals), a batch is its own whole.
  total_tokens = _f32(extras["total_tokens"], m) if "total_tokens" in extras else m.sum()
  total_sequences = (_f32(extras["total_sequences"], m) if "total_sequences" in extras
                     else (n_b > 0).sum().to(torch.float32))
  return total_tokens.clamp_min(1.0), total_sequences.clamp_min(1.0)


def clipped_pg_loss(logprobs: torch.Tensor, loss_mask, extras: Mapping[str, Any], cfg: LossConfig):
  """See `loss_spec.clipped_pg_loss`; same math, same metrics (as detached 0-d tensors)."""
  check_extras(extras, cfg)
  lp = logprobs.to(torch.float32)
  m = _f32(loss_mask, lp)
  # absent: this is the batch's one optimizer step, so prev is the policy now, detached
  prev = _f32(extras["prev_logprobs"], lp) if "prev_logprobs" in extras else lp.detach()
  adv = _f32(extras["advantages"], lp)
  if adv.ndim == 1:
    adv = adv[:, None]
  n_b = m.sum(-1)
  total_tokens, total_sequences = _totals(m, n_b, extras)

  log_ratio = (lp - prev) * m
  if cfg.ratio_level == "sequence":
    seq_log_ratio = log_ratio.sum(-1) / n_b.clamp_min(1.0)
    ratio = torch.exp(seq_log_ratio)[:, None].expand_as(lp)
  else:
    ratio = torch.exp(log_ratio)
  clipped = ratio.clamp(1.0 - cfg.ratio_clip_min, 1.0 + cfg.ratio_clip_max)
  loss1, loss2 = -adv * ratio, -adv * clipped
  pg = torch.maximum(loss1, loss2)
  clip_active = (loss2 > loss1).to(torch.float32)
  dual_active = torch.zeros_like(pg)
  if cfg.ratio_clip_c > 1.0:
    loss3 = -adv * cfg.ratio_clip_c
    dual_active = ((adv < 0) & (loss3 < pg)).to(torch.float32)
    pg = torch.where(adv < 0, torch.minimum(pg, loss3.expand_as(pg)), pg)

  kl = torch.zeros_like(pg)
  if cfg.reference_policy_kl_penalty != 0:
    d = (_f32(extras["reference_logprobs"], lp) - lp) * m
    kl = torch.exp(d) - d - 1.0

  w = torch.ones_like(pg)
  if cfg.use_importance_sampling_correction:
    gen = _f32(extras["generation_logprobs"], lp)
    w = torch.exp((prev - gen) * m).clamp_max(cfg.truncated_importance_sampling_ratio)

  per_token = w * (pg + cfg.reference_policy_kl_penalty * kl)
  if cfg.normalization == "constant":
    loss = (per_token * m).sum() / (total_sequences * cfg.max_completion_tokens)
  elif cfg.normalization == "sequence":
    loss = ((per_token * m).sum(-1) / n_b.clamp_min(1.0)).sum() / total_sequences
  else:
    loss = (per_token * m).sum() / total_tokens

  def tok_mean(x):
    return ((x * m).sum() / total_tokens).detach()

  metrics = dict(
      loss=loss.detach(), pg_loss=tok_mean(w * pg), kl=tok_mean(kl),
      clip_fraction=tok_mean(clip_active), dual_clip_fraction=tok_mean(dual_active),
      ratio_mean=tok_mean(ratio), is_weight_mean=tok_mean(w))
  if "generation_logprobs" in extras:
    diff = (prev - _f32(extras["generation_logprobs"], lp)) * m
    metrics.update(is_ratio_mean=tok_mean(torch.exp(diff)), is_logprob_abs_diff_mean=tok_mean(diff.abs()))
    if cfg.use_importance_sampling_correction:
      metrics["is_truncated_fraction"] = tok_mean(
          (torch.exp(diff) > cfg.truncated_importance_sampling_ratio).to(torch.float32))
  return loss, metrics


def make_pg_loss(cfg: LossConfig):
  """A `LossFn` closed over `cfg`."""
  def loss_fn(logprobs, loss_mask, extras):
    return clipped_pg_loss(logprobs, loss_mask, extras, cfg)
  return loss_fn


def nll_loss(logprobs: torch.Tensor, loss_mask, extras: Mapping[str, Any]):
  """Masked NLL per token (SFT warm start); see `loss_spec.nll_loss`."""
  lp = logprobs.to(torch.float32)
  m = _f32(loss_mask, lp)
  total_tokens = _totals(m, m.sum(-1), extras)[0]
  loss = -(lp * m).sum() / total_tokens
  return loss, dict(loss=loss.detach(), nll=loss.detach())


def topk_kl_loss(logprobs, loss_mask, extras: Mapping[str, Any], weights):
  """The top-k reverse KL to the teachers, per `dockyard.distill.topk_kl_loss` (the spec). The
  gradient flows through extras['topk_logprobs'] (the trainer's, per the top-k contract of
  `dockyard.policy`); `logprobs` is not read."""
  from dockyard.distill import REST_FLOOR
  student = torch.as_tensor(extras["topk_logprobs"]).to(torch.float32)
  m = torch.as_tensor(loss_mask, dtype=torch.float32, device=student.device)
  total_tokens = _totals(m, m.sum(-1), extras)[0]
  teacher = _f32(extras["teacher_topk_logprobs"], student)
  k = student.shape[-1] // len(weights)
  rows = extras.get("teacher_weights")   # [B, M], each row's teacher weights (the spec's)
  rows = (_f32(rows, student) if rows is not None
          else torch.tensor(weights, dtype=torch.float32, device=student.device).expand(m.shape[0], len(weights)))
  per_token, mass0 = torch.zeros_like(m), None
  for i in range(len(weights)):
    s, q = student[..., i * k:(i + 1) * k], teacher[..., i * k:(i + 1) * k]
    ps, pq = s.exp(), q.exp()
    rest_s = (1.0 - ps.sum(-1)).clamp_min(REST_FLOOR)
    rest_q = (1.0 - pq.sum(-1)).clamp_min(REST_FLOOR)
    per_token = per_token + rows[:, i, None] * ((ps * (s - q)).sum(-1) + rest_s * (rest_s.log() - rest_q.log()))
    mass0 = ps.sum(-1) if mass0 is None else mass0
  loss = (per_token * m).sum() / total_tokens
  return loss, dict(topk_kl=loss.detach(), topk_student_mass=((mass0 * m).sum() / total_tokens).detach())


def make_topk_kl_loss(weights):
  """A `LossFn` closed over the teachers' weights (a tuple: its length is the teacher count)."""
  weights = tuple(float(w) for w in weights)

  def loss_fn(logprobs, loss_mask, extras):
    return topk_kl_loss(logprobs, loss_mask, extras, weights)
  return loss_fn
