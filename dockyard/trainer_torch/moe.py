"""Router losses and expert-load metrics for Mixture-of-Experts models on the torch trainer.

transformers' `Qwen3MoeForCausalLM` returns each sparse layer's router logits ([tokens, experts])
when called with `output_router_logits=True`. From them and a mask of the real tokens, every
training micro-batch gets the same terms, weights and metrics as the JAX trainer's
(`dockyard.trainer_jax.moe`, `train.train_step`):
  - `aux`: the load-balancing loss, transformers' own `load_balancing_loss_func` for Qwen3-MoE
    (num_experts * sum_e f_e * P_e, pooled over the sparse layers and the real tokens), the
    definition the JAX trainer is tested against;
  - `z`: ST-MoE's router z-loss, the mean of logsumexp(router logits)^2 over layers and real
    tokens (transformers has none: it is computed here from the same logits);
  - `load` [layers, experts]: the token-expert assignment counts of the real tokens, from which
    `moe_load_max` / `moe_load_min` (the extreme experts' share vs an even split) are reported.
The policy adds `(aux_loss_coef * aux + z_loss_coef * z) / num_micro` to each micro-batch's loss
(`config.policy.moe`). The JAX trainer's aux-loss-free balancing bias (`bias_update_rate`) has no
counterpart in transformers' router: validation refuses it on this backend, and so does
`RouterLoss.from_config`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np
import torch


@dataclasses.dataclass(frozen=True)
class RouterTerms:
  aux: torch.Tensor    # scalar, differentiable
  z: torch.Tensor      # scalar, differentiable
  load: torch.Tensor   # [layers, experts] float32 assignment counts, no gradient


@dataclasses.dataclass(frozen=True)
class RouterLoss:
  """The router terms' weights and the router's shape (from the model's config)."""
  num_experts: int
  top_k: int
  aux_loss_coef: float = 0.0
  z_loss_coef: float = 0.0

  @classmethod
  def from_config(cls, model_config, section: Mapping[str, Any] | None) -> "RouterLoss | None":
    """None for a dense model; `section` is `config.policy.moe` (absent: coefficients 0)."""
    if not model_config.is_moe:
      return None
    section = dict(section or {})
    rate = float(section.get("bias_update_rate", 0.0))
    if rate:
      raise ValueError(f"config.policy.moe.bias_update_rate={rate}: aux-loss-free balancing needs a "
                       f"per-expert routing bias, which transformers' Qwen3-MoE router has not; it is "
                       f"JAX-only (set it to 0 on policy.backend='torch')")
    return cls(num_experts=model_config.num_experts, top_k=model_config.num_experts_per_tok,
               aux_loss_coef=float(section.get("aux_loss_coef", 0.0)),
               z_loss_coef=float(section.get("z_loss_coef", 0.0)))

  def terms(self, router_logits: Sequence[torch.Tensor], mask: np.ndarray) -> RouterTerms:
    """The terms of one forward pass. router_logits: one [B*T, E] tensor per sparse layer (in
    token order of `mask`); mask [B, T]: 1 for the real tokens (padding, padding rows and the
    packed rows' tails are 0: they count in nothing, as on the JAX side)."""
    logits = [x.float() for x in router_logits]   # the router's softmax runs in fp32 (as JAX's)
    device = logits[0].device
    flat = torch.as_tensor(np.asarray(mask, np.float32).reshape(-1), device=device)
    with torch.no_grad():
      load = torch.stack([
          torch.zeros(self.num_experts, dtype=torch.float32, device=device).scatter_add_(
              0, torch.topk(torch.softmax(x, -1), self.top_k, dim=-1).indices.reshape(-1),
              flat.repeat_interleave(self.top_k))
          for x in logits])
    if not float(np.sum(mask)):   # no real token (a dummy or all-padding micro-batch): no terms
      zero = torch.zeros((), device=device)
      return RouterTerms(zero, zero, load)
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func
    aux = load_balancing_loss_func(tuple(logits), self.num_experts, self.top_k, flat)
    z = sum((torch.logsumexp(x, -1) ** 2 * flat).sum() for x in logits) / (flat.sum() * len(logits))
    return RouterTerms(aux, z, load)

  def loss(self, t: RouterTerms) -> torch.Tensor:
    return self.aux_loss_coef * t.aux + self.z_loss_coef * t.z


def load_metrics(load: torch.Tensor) -> dict[str, float]:
  """load [L, E] assignment counts -> the extreme experts' share vs an even split (1.0 = even)."""
  share = load / load.mean(dim=-1, keepdim=True).clamp_min(1e-9)
  return dict(moe_load_max=float(share.max()), moe_load_min=float(share.min()))
