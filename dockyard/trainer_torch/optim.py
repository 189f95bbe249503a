"""AdamW with warmup + cosine decay and global-norm clipping, with the JAX trainer's semantics.

The JAX side is `optax.chain(clip_by_global_norm(c), adamw(schedule))` with
`warmup_cosine_decay_schedule(0, lr, warmup, decay, lr * end_lr_factor)` evaluated at the number
of updates taken so far (so the first update uses schedule(0)). torch's AdamW applies decoupled
decay as `p -= lr * wd * p` before the Adam step, as optax's `add_decayed_weights` does; the
clip here uses optax's rule (scale by c / norm only when norm > c; torch's own adds 1e-6).
The schedule is a plain function of the step, so a checkpoint only needs the step count.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import torch


def lr_at(step: int, optim: Mapping[str, Any], total_steps: int) -> float:
  """optax.warmup_cosine_decay_schedule(0, lr, warmup, decay, lr * end_lr_factor)(step)."""
  peak = float(optim["lr"])
  warmup = int(optim["warmup_steps"])
  decay = int(optim["decay_steps"]) or int(total_steps)
  if decay <= warmup:
    raise ValueError(f"optim.decay_steps ({decay}; 0 means the run's step count) must exceed "
                     f"optim.warmup_steps ({warmup})")
  end = peak * float(optim["end_lr_factor"])
  if step < warmup:
    return peak * step / warmup
  alpha = end / peak if peak else 0.0
  t = min(step - warmup, decay - warmup) / (decay - warmup)
  return peak * ((1.0 - alpha) * 0.5 * (1.0 + math.cos(math.pi * t)) + alpha)


def make_optimizer(params: Iterable[torch.nn.Parameter], optim: Mapping[str, Any]) -> torch.optim.AdamW:
  # lr is set before every step from `lr_at`; foreach=False keeps DTensor math per parameter.
  return torch.optim.AdamW(
      list(params), lr=0.0, betas=(float(optim["b1"]), float(optim["b2"])), eps=float(optim["eps"]),
      weight_decay=float(optim["weight_decay"]), foreach=False)


def global_norm(grads: list[torch.Tensor]) -> torch.Tensor:
  """The L2 norm over all gradients (DTensor shards included) as a plain 0-d float32 tensor."""
  norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
  if hasattr(norm, "full_tensor"):  # sharded gradients give a DTensor norm
    norm = norm.full_tensor()
  return norm.to(torch.float32)


def clip_(grads: list[torch.Tensor], norm: torch.Tensor, max_norm: float) -> None:
  """optax.clip_by_global_norm: g * max_norm / norm when norm > max_norm, else unchanged."""
  if max_norm > 0 and float(norm) > max_norm:
    scale = max_norm / float(norm)
    for g in grads:
      g.mul_(scale)
