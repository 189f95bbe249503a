"""LoRA for the NNX decoder: adapters on chosen projections, the base frozen.

`attach(model, cfg, mesh, rules, seed)` gives each targeted projection (`HeadsProj`, `OutProj`,
`Dense` in `model.py`, which call `self.lora` when it is set) a `LoRAAdapter`: factors
`lora_a` [*kernel input dims, rank] and `lora_b` [rank, *kernel output dims], both
`nnx.LoRAParam` (flax's own Variable type for adapters, a subclass of `nnx.Param`), so the
optimizer is built with `wrt=nnx.LoRAParam` and holds moments for the adapters alone, and the
train step differentiates only them. flax's `nnx.LoRA` module is 2-D only ([in, r] @ [r, out]);
the decoder's q/k/v kernels are [embed, heads, head_dim] and o's [heads, head_dim, embed], so the
adapter here contracts its factors against the kernel's own axes instead (`tensordot`), which
keeps the logical sharding axes of the kernel on each factor and makes the merge
(`kernel + scale * a . b`) the kernel's exact shape.

Initialisation follows PEFT: a uniform in +-1/sqrt(fan_in) (kaiming-uniform with a=sqrt(5)), b
zero, so the adapted model starts equal to the base. Dropout (on the adapter's input only, as
PEFT does) draws from each adapter's own 'dropout' stream; it is active only inside the train
step (`train.train_step` puts its merged copy in training mode and carries the streams' counts
across micro-batches and steps), never in `logprobs` or the canary.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from dockyard.models import name_map
from dockyard.models.lora import LoRAConfig
from dockyard.trainer_jax import sharding as shd
from dockyard.trainer_jax.model import Dense, HeadsProj, OutProj, flat_matmul

ADAPTER_FILTER = nnx.LoRAParam
BASE_FILTER = nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))


class LoRAAdapter(nnx.Module):
  """`scale * (dropout(x) . a) . b`; `n_in` leading kernel axes are contracted with x's last."""

  def __init__(self, a: jax.Array, b: jax.Array, a_axes, b_axes, scale: float, dropout: float,
               rngs: nnx.Rngs | None):
    self.lora_a = nnx.LoRAParam(a, out_sharding=tuple(a_axes))
    self.lora_b = nnx.LoRAParam(b, out_sharding=tuple(b_axes))
    self.n_in = a.ndim - 1
    self.scale = float(scale)
    self.dropout = nnx.Dropout(dropout, deterministic=True, rngs=rngs) if dropout > 0 else None

  def __call__(self, x):
    if self.dropout is not None:
      x = self.dropout(x)
    a = self.lora_a[...].astype(x.dtype)
    b = self.lora_b[...].astype(x.dtype)
    # 2-D matmuls over the flattened tokens (`flat_matmul`, the same numbers as tensordot): over
    # 3-D activations XLA:CPU computes the adapters' gradients from transposed copies, ~1.7x slower
    # for a rank-16 adapter on a 135M projection (docs/trainer_speed.md, "2-D matmuls").
    lead = x.shape[:x.ndim - self.n_in]
    h = flat_matmul(x.reshape(*lead, -1), a.reshape(-1, a.shape[-1]))
    return self.scale * flat_matmul(h, b.reshape(b.shape[0], -1)).reshape(*lead, *b.shape[1:])

  def delta(self) -> jax.Array:
    """The merged update `scale * a . b`, in the kernel's shape (float32)."""
    a = self.lora_a[...].astype(jnp.float32)
    b = self.lora_b[...].astype(jnp.float32)
    return self.scale * jnp.tensordot(a, b, axes=1)


def _projections(model, targets):
  """(entry-style NNX path of the kernel, projection module) for every targeted projection."""
  for i, layer in enumerate(model.layers):
    for name in targets:
      parent, where = (layer.attn, "attn") if name in ("q_proj", "k_proj", "v_proj", "o_proj") else (layer.mlp, "mlp")
      proj = getattr(parent, name)
      if not isinstance(proj, (HeadsProj, OutProj, Dense)):   # a sparse (MoE) layer's expert stack
        raise ValueError(f"policy.lora.targets: {name!r} of layer {i} is a Mixture-of-Experts "
                         f"expert stack, which LoRA here does not adapt; target the attention "
                         f"projections (q/k/v/o_proj) on this model")
      yield f"layers.{i}.{where}.{name}.kernel", proj


def attach(model, cfg: LoRAConfig, mesh, rules, seed: int = 0) -> None:
  """Adds an adapter to each targeted projection of `model` (in place), each factor placed on
  the sharding its kernel's logical axes give it."""
  key = jax.random.key(seed)
  with nnx.use_eager_sharding(False):
    for k, (path, proj) in enumerate(_projections(model, cfg.targets)):
      if getattr(proj, "lora", None) is not None:
        raise ValueError(f"{path} already has a LoRA adapter")
      kernel = proj.kernel
      axes = kernel.get_metadata().get("out_sharding") or (None,) * kernel.ndim
      n_in = 2 if isinstance(proj, OutProj) else 1   # OutProj's kernel is [heads, head_dim, embed]
      in_shape, out_shape = kernel.shape[:n_in], kernel.shape[n_in:]
      a_shape, a_axes = tuple(in_shape) + (cfg.rank,), tuple(axes[:n_in]) + (None,)
      b_shape, b_axes = (cfg.rank,) + tuple(out_shape), (None,) + tuple(axes[n_in:])
      bound = 1.0 / math.sqrt(int(np.prod(in_shape)))
      a = jax.random.uniform(jax.random.fold_in(key, k), a_shape, jnp.float32, -bound, bound)
      dtype = kernel.dtype
      a = jax.device_put(a.astype(dtype), NamedSharding(mesh, shd.logical_to_spec(a_axes, a_shape, rules, mesh)))
      b = jax.device_put(jnp.zeros(b_shape, dtype), NamedSharding(mesh, shd.logical_to_spec(b_axes, b_shape, rules, mesh)))
      # `lora` starts as a static None in the projection: nnx.data makes it a child module.
      # Each adapter its own dropout stream: q/k/v see the same input and need their own masks.
      rngs = nnx.Rngs(dropout=jax.random.fold_in(key, (1 << 20) + k)) if cfg.dropout > 0 else None
      proj.lora = nnx.data(LoRAAdapter(a, b, a_axes, b_axes, cfg.scale, cfg.dropout, rngs))


def adapters(model) -> dict[str, LoRAAdapter]:
  """Kernel path ('layers.0.attn.q_proj.kernel') -> its adapter, for every adapted projection."""
  out = {}
  for i, layer in enumerate(model.layers):
    for where, parent in (("attn", layer.attn), ("mlp", layer.mlp)):
      for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
        proj = getattr(parent, name, None)
        if isinstance(proj, (HeadsProj, OutProj, Dense)) and proj.lora is not None:
          out[f"layers.{i}.{where}.{name}.kernel"] = proj.lora
  return out


def has_adapters(model) -> bool:
  return bool(adapters(model))


@jax.jit
def _merge(kernel, a, b, scale):
  delta = scale * jnp.tensordot(a.astype(jnp.float32), b.astype(jnp.float32), axes=1)
  return (kernel.astype(jnp.float32) + delta).astype(kernel.dtype)


def merged_kernels(model) -> dict[str, jax.Array]:
  """Kernel path -> `kernel + scale * a . b` (in the kernel's dtype and sharding) for every
  adapted projection: the tensors a LoRA step changes."""
  out = {}
  for path, adapter in adapters(model).items():
    proj_kernel = _kernel_of(model, path)
    out[path] = _merge(proj_kernel, adapter.lora_a[...], adapter.lora_b[...], jnp.float32(adapter.scale))
  return out


def _kernel_of(model, path: str) -> jax.Array:
  _, i, where, name, _ = path.split(".")
  return getattr(getattr(model.layers[int(i)], where), name).kernel[...]


def peft_tensors(model) -> dict[str, np.ndarray]:
  """The adapters in PEFT's layout and names (what `save_pretrained` of a peft model writes)."""
  out = {}
  entries = {e.nnx: e for e in name_map.table(model.config)}
  for path, adapter in adapters(model).items():
    a_name, b_name = name_map.peft_names(entries[path])
    a, b = name_map.adapter_to_peft(np.asarray(jax.device_get(adapter.lora_a[...])),
                                    np.asarray(jax.device_get(adapter.lora_b[...])))
    out[a_name], out[b_name] = a, b
  return out
