"""Context parallelism: a 'sequence' mesh axis that splits each row's tokens across devices.

With `config.mesh.axes` holding 'sequence' (size > 1 in `config.mesh.shape`), the policy puts the
batch's token dimension on that axis (`dockyard.trainer_jax.policy`), so embeddings, projections,
MLPs and norms run on each device's block of tokens (GSPMD propagates the split from the inputs).
Attention is the one place a token needs the others: `attention` runs under `jax.shard_map`, each
device keeps its own block of queries, all-gathers the keys and values over the axis, and masks
with global positions (causal, right-padding lengths, packed segment ids, sliding window), so
the result equals the unsplit attention. The all-gather form holds every key of a row on every
device (memory O(T) per device for K/V, O(T/s x T) logits); ring attention, which passes K/V
blocks around instead, is not done.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

AXIS = "sequence"


def axis_size(mesh) -> int:
  """The 'sequence' axis' size in `mesh` (1 when it has none)."""
  return int(dict(mesh.shape).get(AXIS, 1))


def _names(target) -> tuple[str, ...]:
  if target is None:
    return ()
  return tuple(target) if isinstance(target, (tuple, list)) else (target,)


@dataclasses.dataclass(frozen=True)
class SeqParallel:
  """What an `Attention` needs to split itself (hashable: it is static in the NNX graph)."""
  mesh: jax.sharding.Mesh
  batch: tuple[str, ...]   # mesh axes of the batch dimension
  heads: tuple[str, ...]   # mesh axes of the heads dimension (empty: heads replicated)

  def _fit(self, axes: tuple[str, ...], dim: int):
    axes = tuple(a for a in axes if self.mesh.shape[a] > 1)
    while axes and dim % _prod(self.mesh, axes):
      axes = axes[:-1]
    return None if not axes else (axes[0] if len(axes) == 1 else axes)


def _prod(mesh, axes) -> int:
  out = 1
  for a in axes:
    out *= int(mesh.shape[a])
  return out


def make(mesh, rules) -> SeqParallel | None:
  """The split for `mesh` and the logical `rules`, or None when there is no 'sequence' axis > 1."""
  if axis_size(mesh) <= 1:
    return None
  table = dict(rules)
  for name, target in table.items():
    if AXIS in _names(target):
      raise ValueError(f"config.mesh.rules maps {name!r} to the {AXIS!r} mesh axis, which splits "
                       f"tokens only (dockyard/trainer_jax/context_parallel.py)")
  return SeqParallel(mesh, _names(table.get("batch")), _names(table.get("heads")))


def enable(model, sp: SeqParallel | None) -> None:
  """Makes every attention layer of `model` (a `Decoder`) context-parallel under `sp`. Qwen3-Next's
  Gated DeltaNet layers (no `attn`) have no split form: a 'sequence' axis is refused for them."""
  for layer in model.layers:
    if layer.attn is None:
      if sp is not None:
        raise ValueError("context parallelism (a 'sequence' mesh axis) is not implemented for Gated "
                         "DeltaNet layers (qwen3_next): their recurrence runs over the whole row")
      continue
    layer.attn.seq_parallel = sp


def attention(sp: SeqParallel, q, k, v, lengths, segment_ids, *, scale, sliding_window: int):
  """Causal attention, q [B, T, H, D], k/v [B, T, K, D], with the tokens split over 'sequence'.

  Either `lengths` [B] (right padding: keys at or past a row's length are masked) or
  `segment_ids` [B, T] (packed rows: a query sees only its own segment) is given. Each device
  holds T/s queries and all T keys (all-gathered); the masks use global positions, so the result
  is the unsplit one (`jax.nn.dot_product_attention`'s reference kernel, the same as
  `model.Attention` calls unsplit)."""
  b, t, h, _ = q.shape
  kh = k.shape[2]
  batch = sp._fit(sp.batch, b)
  # GQA: q head j reads k head j // (h / kh); a heads split keeps that pairing only if it divides both.
  heads = sp._fit(sp.heads, h) if sp._fit(sp.heads, kh) == sp._fit(sp.heads, h) else None
  tok = P(batch, AXIS, heads, None)
  packed = segment_ids is not None
  extra = segment_ids if packed else lengths
  extra_spec = P(batch, AXIS) if packed else P(batch)

  def local(q, k, v, extra):
    tl = q.shape[1]
    k = jax.lax.all_gather(k, AXIS, axis=1, tiled=True)
    v = jax.lax.all_gather(v, AXIS, axis=1, tiled=True)
    q_pos = jax.lax.axis_index(AXIS) * tl + jnp.arange(tl)      # this block's global positions
    k_pos = jnp.arange(k.shape[1])
    ok = (k_pos[None, :] <= q_pos[:, None])[None]               # [1, Tl, T]
    if sliding_window:
      ok = ok & (q_pos[:, None] - k_pos[None, :] < sliding_window)[None]
    if packed:
      seg_k = jax.lax.all_gather(extra, AXIS, axis=1, tiled=True)
      ok = ok & (extra[:, :, None] == seg_k[:, None, :])
    else:
      ok = ok & (k_pos[None, None, :] < extra[:, None, None])
    return jax.nn.dot_product_attention(q, k, v, mask=ok[:, None], scale=scale)

  return jax.shard_map(local, mesh=sp.mesh, in_specs=(tok, tok, tok, extra_spec), out_specs=tok,
                       check_vma=False)(q, k, v, extra)
