"""The reward model's Bradley-Terry loss in torch, following `dockyard.rm.loss_spec` exactly (as
`dockyard.trainer_jax.reward_loss` does in JAX): `reward_loss(rewards, extras)`. Only `rewards`
carries gradient; the metrics are detached.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F

from dockyard.rm.loss_spec import check_inputs


def reward_loss(rewards: torch.Tensor, extras: Mapping[str, Any]):
  """See `loss_spec.reward_loss`; same math, same metrics (as detached 0-d tensors)."""
  check_inputs(tuple(rewards.shape), extras)
  r = rewards.to(torch.float32)
  r_w, r_l = r[0::2], r[1::2]
  f32 = dict(dtype=torch.float32, device=r.device)
  margin = torch.as_tensor(extras["margin"], **f32).detach() if "margin" in extras else torch.zeros_like(r_w)
  total = (torch.as_tensor(extras["total_pairs"], **f32) if "total_pairs" in extras
           else torch.tensor(float(r_w.shape[0]), **f32)).clamp_min(1.0)

  def mean(x):
    return x.sum() / total

  loss = mean(-F.logsigmoid(r_w - r_l - margin))
  metrics = dict(loss=loss, rewards_chosen=mean(r_w), rewards_rejected=mean(r_l),
                 reward_margin=mean(r_w - r_l), accuracy=mean((r_w > r_l).to(torch.float32)))
  return loss, {k: v.detach() for k, v in metrics.items()}
