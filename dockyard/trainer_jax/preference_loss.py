"""The DPO-family preference loss in JAX, following `dockyard.dpo.loss_spec` exactly (as
`dockyard.trainer_torch.preference_loss` does in torch).

`preference_loss(logprobs, loss_mask, extras, cfg)` and the `dockyard.policy.LossFn` that
`make_preference_loss(cfg)` returns, traceable under `jax.jit`/`jax.grad`. Rows 2i and 2i+1 are the
chosen and rejected completions of pair i. Only `logprobs` carries gradient: the reference
logprobs are wrapped in `stop_gradient`, and so are the metrics.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from dockyard.dpo.loss_spec import LOG_PROB_CAP, PreferenceConfig, check_inputs


def _log1mexp(a):
  return jnp.where(a > -math.log(2.0), jnp.log(-jnp.expm1(a)), jnp.log1p(-jnp.exp(a)))


def _total_pairs(real, extras: Mapping[str, Any]):
  # The whole batch's pair count under micro-batching (see the spec); alone, the batch's own.
  if "total_pairs" in extras:
    total = jnp.asarray(extras["total_pairs"], jnp.float32)
  elif "total_sequences" in extras:
    total = jnp.asarray(extras["total_sequences"], jnp.float32) / 2.0
  else:
    total = real.sum()
  return jnp.maximum(total, 1.0)


def preference_loss(logprobs, loss_mask, extras: Mapping[str, Any], cfg: PreferenceConfig):
  """See `loss_spec.preference_loss`; same math, same metrics."""
  check_inputs(logprobs.shape, extras, cfg)
  sg = jax.lax.stop_gradient
  lp = logprobs.astype(jnp.float32)
  m = jnp.asarray(loss_mask, jnp.float32)
  n = m.sum(-1)
  s = (lp * m).sum(-1)
  avg = s / jnp.maximum(n, 1.0)
  n_w, n_l, s_w, s_l, avg_w, avg_l = n[0::2], n[1::2], s[0::2], s[1::2], avg[0::2], avg[1::2]
  real = ((n_w > 0) & (n_l > 0)).astype(jnp.float32)
  total_pairs = _total_pairs(real, extras)

  if cfg.needs_reference:
    ref = sg(jnp.asarray(extras["reference_logprobs"], jnp.float32))
    ref_s = (ref * m).sum(-1) if ref.ndim == 2 else ref
    ref_w, ref_l = ref_s[0::2], ref_s[1::2]

  if cfg.mode == "dpo":
    h = cfg.beta * ((s_w - ref_w) - (s_l - ref_l) - cfg.dpop_lambda * jnp.maximum(0.0, ref_w - s_w))
    h = h - cfg.length_alpha * (n_w - n_l)
    eps = cfg.label_smoothing
    pref = -(1.0 - eps) * jax.nn.log_sigmoid(h) - eps * jax.nn.log_sigmoid(-h)
    r_w, r_l = cfg.beta * (s_w - ref_w), cfg.beta * (s_l - ref_l)
  elif cfg.mode == "ipo":
    ref_avg_w, ref_avg_l = ref_w / jnp.maximum(n_w, 1.0), ref_l / jnp.maximum(n_l, 1.0)
    pref = ((avg_w - ref_avg_w) - (avg_l - ref_avg_l) - 1.0 / (2.0 * cfg.beta)) ** 2
    r_w, r_l = cfg.beta * (avg_w - ref_avg_w), cfg.beta * (avg_l - ref_avg_l)
  elif cfg.mode == "simpo":
    pref = -jax.nn.log_sigmoid(cfg.beta * avg_w - cfg.beta * avg_l - cfg.simpo_gamma)
    r_w, r_l = cfg.beta * avg_w, cfg.beta * avg_l
  else:  # orpo
    a_w, a_l = jnp.minimum(avg_w, LOG_PROB_CAP), jnp.minimum(avg_l, LOG_PROB_CAP)
    r_w, r_l = a_w - _log1mexp(a_w), a_l - _log1mexp(a_l)
    pref = -jax.nn.log_sigmoid(r_w - r_l)

  nll = -avg_w
  per_pair = nll + cfg.orpo_lambda * pref if cfg.mode == "orpo" else pref + cfg.sft_weight * nll

  def mean(x):
    return (x * real).sum() / total_pairs

  loss = mean(per_pair)
  metrics = dict(
      loss=loss, preference_loss=mean(pref), sft_nll=mean(nll), rewards_chosen=mean(r_w),
      rewards_rejected=mean(r_l), reward_margin=mean(r_w - r_l),
      reward_accuracy=mean((r_w > r_l).astype(jnp.float32)))
  return loss, {k: sg(v) for k, v in metrics.items()}


def make_preference_loss(cfg: PreferenceConfig):
  """A `LossFn` closed over `cfg` (static: its branches are chosen at trace time)."""
  def loss_fn(logprobs, loss_mask, extras):
    return preference_loss(logprobs, loss_mask, extras, cfg)
  return loss_fn
