"""The reward model's Bradley-Terry loss in JAX, following `dockyard.rm.loss_spec` exactly (as
`dockyard.trainer_torch.reward_loss` does in torch): `reward_loss(rewards, extras)`, traceable
under `jax.jit`/`jax.grad`. Only `rewards` carries gradient; the metrics are stop_gradient'ed.
"""
from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp

from dockyard.rm.loss_spec import check_inputs


def reward_loss(rewards, extras: Mapping[str, Any]):
  """See `loss_spec.reward_loss`; same math, same metrics."""
  check_inputs(rewards.shape, extras)
  r = rewards.astype(jnp.float32)
  r_w, r_l = r[0::2], r[1::2]
  margin = jnp.asarray(extras["margin"], jnp.float32) if "margin" in extras else jnp.zeros_like(r_w)
  total = jnp.asarray(extras["total_pairs"], jnp.float32) if "total_pairs" in extras else r_w.shape[0]
  total = jnp.maximum(total, 1.0)

  def mean(x):
    return jnp.sum(x) / total

  loss = mean(-jax.nn.log_sigmoid(r_w - r_l - jax.lax.stop_gradient(margin)))
  metrics = dict(loss=loss, rewards_chosen=mean(r_w), rewards_rejected=mean(r_l),
                 reward_margin=mean(r_w - r_l), accuracy=mean((r_w > r_l).astype(jnp.float32)))
  return loss, {k: jax.lax.stop_gradient(v) for k, v in metrics.items()}
