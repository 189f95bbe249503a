"""The training side of Mixture-of-Experts: router losses, load metrics, aux-loss-free balancing.

The sparse layers (`model.MoE`) leave what their router did in their `RouterStats` variables on
every forward pass; `train.train_step` reads them from the model it just ran and
  - adds `aux_loss_coef * aux_loss + z_loss_coef * z_loss` to the micro-batch's loss, where
    `aux_loss` is transformers' `load_balancing_loss_func` for Qwen3-MoE (Switch Transformer's
    num_experts * sum_e f_e * P_e, with f_e the fraction of token-expert assignments and P_e the
    mean router probability, both pooled over every sparse layer's real tokens) and `z_loss` is
    ST-MoE's mean of logsumexp(router logits)^2 over layers and real tokens;
  - reports `moe_aux_loss`, `moe_z_loss` and the step's expert load (`moe_load_max` /
    `moe_load_min`: the most / least loaded expert's share relative to a perfectly even split,
    1.0 = balanced, over all sparse layers);
  - when `bias_update_rate > 0`, moves each layer's `ExpertBias` by rate * sign(mean load - load)
    after the optimizer update (DeepSeek-V3's aux-loss-free balancing: overloaded experts become
    less likely to be picked, underloaded ones more).
Coefficients come from `config.policy.moe` (`MoEOptions.from_config`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from dockyard.trainer_jax.model import MoE


@dataclasses.dataclass(frozen=True)
class MoEOptions:
  """Hashable (a static argument of the jitted step)."""
  aux_loss_coef: float = 0.0      # load-balancing loss weight (Qwen3-MoE ships router_aux_loss_coef=0.001)
  z_loss_coef: float = 0.0        # router z-loss weight (ST-MoE uses 1e-3)
  bias_update_rate: float = 0.0   # aux-loss-free balancing step (DeepSeek-V3 uses 1e-3); 0 = off

  @classmethod
  def from_config(cls, section: Mapping[str, Any] | None) -> "MoEOptions":
    section = dict(section or {})
    return cls(aux_loss_coef=float(section.get("aux_loss_coef", 0.0)),
               z_loss_coef=float(section.get("z_loss_coef", 0.0)),
               bias_update_rate=float(section.get("bias_update_rate", 0.0)))


def sparse_layers(model) -> list[MoE]:
  return [layer.mlp for layer in model.layers if isinstance(layer.mlp, MoE)]


def router_stats(model) -> dict[str, jax.Array]:
  """The last forward pass's statistics, stacked over sparse layers: load / prob_sum [L, E],
  z_sum / tokens [L]."""
  blocks = sparse_layers(model)
  return {name: jnp.stack([getattr(b, name)[...] for b in blocks])
          for name in ("load", "prob_sum", "z_sum", "tokens")}


def aux_loss(stats: Mapping[str, jax.Array]) -> jax.Array:
  """transformers' `load_balancing_loss_func` (Qwen3-MoE) from pooled statistics."""
  rows = jnp.maximum(stats["tokens"].sum(), 1.0)
  fraction = stats["load"].sum(0) / rows          # sums to top_k: assignments, not tokens
  prob = stats["prob_sum"].sum(0) / rows
  return stats["load"].shape[-1] * jnp.sum(fraction * prob)


def z_loss(stats: Mapping[str, jax.Array]) -> jax.Array:
  return stats["z_sum"].sum() / jnp.maximum(stats["tokens"].sum(), 1.0)


def load_metrics(load: jax.Array) -> dict[str, jax.Array]:
  """load [L, E] assignment counts -> the extreme experts' share vs an even split (1.0 = even)."""
  share = load / jnp.maximum(load.mean(axis=-1, keepdims=True), 1e-9)
  return dict(moe_load_max=share.max(), moe_load_min=share.min())


def update_expert_bias(model, load: jax.Array, rate: float) -> None:
  """bias += rate * sign(mean load - load), per sparse layer (load [L, E] from the whole step)."""
  for block, layer_load in zip(sparse_layers(model), load):
    step = rate * jnp.sign(layer_load.mean() - layer_load)
    block.expert_bias[...] = block.expert_bias[...] + step


def expert_load(model) -> jax.Array:
  """[L, E] assignment counts of the model's last forward pass (e.g. after `logprob_step`)."""
  return router_stats(model)["load"]
