"""The mesh and the logical-axis rules, applied at the edge of the model.

Modules name their axes logically ('embed', 'mlp', 'heads', 'vocab', 'batch'); `config.mesh.rules`
maps them to the mesh axes ('data', 'fsdp', 'tensor'). A dimension that a mesh axis does not
divide (e.g. 2 KV heads on 8-way tensor parallelism) is replicated along that axis instead of
failing, since the tiny models used here cannot always be split 8 ways.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from dockyard.validate import resolve_mesh_shape

Rules = Sequence[tuple[str, Any]]


def make_mesh(shape: Sequence[int], axes: Sequence[str] = ("data", "fsdp", "tensor"),
              devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
  """A mesh over `devices` (default: all), with -1 in `shape` filled by the rest."""
  devices = list(devices) if devices is not None else jax.devices()
  shape = resolve_mesh_shape(shape, len(devices))
  if len(shape) != len(axes):
    raise ValueError(f"mesh shape {shape} has {len(shape)} entries but axes {tuple(axes)} has {len(axes)}")
  # Auto axes: GSPMD propagates activation shardings from the parameters and the batch.
  return jax.make_mesh(shape, tuple(axes), axis_types=(AxisType.Auto,) * len(axes), devices=devices)


def _axis_size(mesh, axis) -> int:
  if axis is None:
    return 1
  names = axis if isinstance(axis, (tuple, list)) else (axis,)
  return int(np.prod([mesh.shape[n] for n in names]))


def logical_to_spec(logical: Sequence[str | None], shape: Sequence[int], rules: Rules, mesh) -> P:
  """Maps logical names to a PartitionSpec; axes that do not divide their dimension replicate."""
  table = {name: target for name, target in rules}
  out, used = [], set()
  for name, dim in zip(logical, shape):
    target = table.get(name) if name is not None else None
    if isinstance(target, list):
      target = tuple(target)
    names = target if isinstance(target, tuple) else ((target,) if target else ())
    # A mesh axis may appear once per spec, and must divide the dimension.
    names = tuple(n for n in names if n not in used and mesh.shape[n] > 1)
    while names and dim % _axis_size(mesh, names):
      names = names[:-1]
    used.update(names)
    out.append(None if not names else (names[0] if len(names) == 1 else names))
  return P(*out)


def state_shardings(state: nnx.State, rules: Rules, mesh) -> nnx.State:
  """NamedSharding per Variable of an (abstract) state, from its `out_sharding` logical names."""
  def one(v):
    logical = v.get_metadata().get("out_sharding") or (None,) * len(v.shape)
    return NamedSharding(mesh, logical_to_spec(logical, v.shape, rules, mesh))
  return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_sharding(mesh, rules: Rules, ndim: int, batch_dim: int = 0,
                   token_dim: int | None = None) -> NamedSharding:
  """Sharding of a batch array: dimension `batch_dim` over the 'batch' rule's mesh axes, and
  `token_dim` (if given) over the 'sequence' axis when the mesh has one of size > 1
  (context parallelism, `dockyard.trainer_jax.context_parallel`)."""
  table = dict(rules)
  target = table.get("batch")
  target = tuple(target) if isinstance(target, (list, tuple)) else target
  spec = [None] * ndim
  spec[batch_dim] = target
  if token_dim is not None and dict(mesh.shape).get("sequence", 1) > 1:
    spec[token_dim] = "sequence"
  return NamedSharding(mesh, P(*spec))


def batch_axis_size(mesh, rules: Rules) -> int:
  target = dict(rules).get("batch")
  return _axis_size(mesh, tuple(target) if isinstance(target, (list, tuple)) else target)
