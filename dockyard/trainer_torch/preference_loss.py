"""The DPO-family preference loss in torch, following `dockyard.dpo.loss_spec` exactly (as
`dockyard.trainer_jax.preference_loss` does in JAX).

`preference_loss(logprobs, loss_mask, extras, cfg)` and the `dockyard.policy.LossFn` that
`make_preference_loss(cfg)` returns. Rows 2i and 2i+1 are the chosen and rejected completions of
pair i. Only `logprobs` carries gradient: the reference logprobs and the metrics are detached.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import torch
import torch.nn.functional as F

from dockyard.dpo.loss_spec import LOG_PROB_CAP, PreferenceConfig, check_inputs


def _f32(x, like: torch.Tensor) -> torch.Tensor:
  return torch.as_tensor(x, dtype=torch.float32, device=like.device).detach()


def _log1mexp(a: torch.Tensor) -> torch.Tensor:
  return torch.where(a > -math.log(2.0), torch.log(-torch.expm1(a)), torch.log1p(-torch.exp(a)))


def _total_pairs(real: torch.Tensor, extras: Mapping[str, Any]) -> torch.Tensor:
  # The whole batch's pair count under micro-batching (see the spec); alone, the batch's own.
  if "total_pairs" in extras:
    total = _f32(extras["total_pairs"], real)
  elif "total_sequences" in extras:
    total = _f32(extras["total_sequences"], real) / 2.0
  else:
    total = real.sum()
  return total.clamp_min(1.0)


def preference_loss(logprobs: torch.Tensor, loss_mask, extras: Mapping[str, Any],
                    cfg: PreferenceConfig):
  """See `loss_spec.preference_loss`; same math, same metrics (as detached 0-d tensors)."""
  check_inputs(tuple(logprobs.shape), extras, cfg)
  lp = logprobs.to(torch.float32)
  m = _f32(loss_mask, lp)
  n = m.sum(-1)
  s = (lp * m).sum(-1)
  avg = s / n.clamp_min(1.0)
  n_w, n_l, s_w, s_l, avg_w, avg_l = n[0::2], n[1::2], s[0::2], s[1::2], avg[0::2], avg[1::2]
  real = ((n_w > 0) & (n_l > 0)).to(torch.float32)
  total_pairs = _total_pairs(real, extras)

  if cfg.needs_reference:
    ref = _f32(extras["reference_logprobs"], lp)
    ref_s = (ref * m).sum(-1) if ref.ndim == 2 else ref
    ref_w, ref_l = ref_s[0::2], ref_s[1::2]

  if cfg.mode == "dpo":
    h = cfg.beta * ((s_w - ref_w) - (s_l - ref_l) - cfg.dpop_lambda * (ref_w - s_w).clamp_min(0.0))
    h = h - cfg.length_alpha * (n_w - n_l)
    eps = cfg.label_smoothing
    pref = -(1.0 - eps) * F.logsigmoid(h) - eps * F.logsigmoid(-h)
    r_w, r_l = cfg.beta * (s_w - ref_w), cfg.beta * (s_l - ref_l)
  elif cfg.mode == "ipo":
    ref_avg_w, ref_avg_l = ref_w / n_w.clamp_min(1.0), ref_l / n_l.clamp_min(1.0)
    pref = ((avg_w - ref_avg_w) - (avg_l - ref_avg_l) - 1.0 / (2.0 * cfg.beta)) ** 2
    r_w, r_l = cfg.beta * (avg_w - ref_avg_w), cfg.beta * (avg_l - ref_avg_l)
  elif cfg.mode == "simpo":
    pref = -F.logsigmoid(cfg.beta * avg_w - cfg.beta * avg_l - cfg.simpo_gamma)
    r_w, r_l = cfg.beta * avg_w, cfg.beta * avg_l
  else:  # orpo
    a_w, a_l = avg_w.clamp_max(LOG_PROB_CAP), avg_l.clamp_max(LOG_PROB_CAP)
    r_w, r_l = a_w - _log1mexp(a_w), a_l - _log1mexp(a_l)
    pref = -F.logsigmoid(r_w - r_l)

  nll = -avg_w
  per_pair = nll + cfg.orpo_lambda * pref if cfg.mode == "orpo" else pref + cfg.sft_weight * nll

  def mean(x):
    return (x * real).sum() / total_pairs

  loss = mean(per_pair)
  metrics = dict(
      loss=loss, preference_loss=mean(pref), sft_nll=mean(nll), rewards_chosen=mean(r_w),
      rewards_rejected=mean(r_l), reward_margin=mean(r_w - r_l),
      reward_accuracy=mean((r_w > r_l).to(torch.float32)))
  return loss, {k: v.detach() for k, v in metrics.items()}


def make_preference_loss(cfg: PreferenceConfig):
  """A `LossFn` closed over `cfg`."""
  def loss_fn(logprobs, loss_mask, extras):
    return preference_loss(logprobs, loss_mask, extras, cfg)
  return loss_fn
