"""How weights travel from the trainer to the engines; the synchronizer picks one.

- `InProcessTransport`: colocated engine in this process; arrays go straight in (no copy to disk).
- `ObjectStoreTransport`: a Ray fleet on this node or another: the arrays `ray.put` once (one
  copy into the store), every engine reads the same object (on one node: mapped, no copy).
- `SharedMemoryTransport`: engines on this host: one POSIX shared-memory block, an index of
  (name, offset, dtype, shape), the workers copy out of it.
- `NcclTransport` (`refit/nccl.py`): GPU, non-colocated: a broadcast into the vLLM workers.
The shared-memory layout is `dockyard.rollout.wire`'s, which the workers read.
Each `send(named_weights, version)` returns the bytes moved.
"""
from __future__ import annotations

import abc
from typing import Iterable

import numpy as np

from dockyard.rollout import wire

Named = Iterable[tuple[str, np.ndarray]]


class Transport(abc.ABC):
  name = "?"

  @abc.abstractmethod
  def send(self, named: Named, version: int) -> int:
    """Moves the weights to every engine and makes `version` current there; returns bytes moved."""

  def close(self) -> None:
    pass


def _materialize(named: Named) -> list[tuple[str, np.ndarray]]:
  out = []
  for name, array in named:
    if not isinstance(name, str):
      raise TypeError(f"named_weights must yield (str, array), got a name of type {type(name).__name__}")
    out.append((name, np.asarray(array)))
  if not out:
    raise ValueError("named_weights yielded nothing: no weights to sync")
  return out


class InProcessTransport(Transport):
  name = "inprocess"

  def __init__(self, generator):
    self.generator = generator

  def send(self, named, version):
    named = _materialize(named)
    self.generator.update_weights(named, version)
    return sum(a.nbytes for _, a in named)


class ObjectStoreTransport(InProcessTransport):
  """For `RolloutFleet`: the same hand-over of arrays, to the fleet, whose `update_weights` makes
  one `ray.put` shared by every engine (and kept for restarted engines)."""
  name = "object_store"


class SharedMemoryTransport(Transport):
  """For an engine (or fleet) on this host with `load_shared_memory(block, index, version)`."""
  name = "shared_memory"

  def __init__(self, generator):
    self.generator = generator

  def send(self, named, version):
    block, index, nbytes = wire.write_shared_memory(_materialize(named))
    try:
      self.generator.load_shared_memory(block.name, index, version)
    finally:
      block.close()
      block.unlink()
    return nbytes
