"""How weights travel from the trainer to the engines; the synchronizer picks one.

- `InProcessTransport`: colocated engine in this process; arrays go straight in (no copy to disk).
- `ObjectStoreTransport`: a Ray fleet on this node or another: packed once, `ray.put` once, every
  engine reads the same object (Ray's shared-memory object store on one node).
- `SharedMemoryTransport`: engines on this host: one POSIX shared-memory block, an index of
  (name, offset, dtype, shape), the workers copy out of it.
- `HttpTransport`: across hosts without Ray: a safetensors body POSTed to a `WeightReceiver`.
- `NcclTransport` (`refit/nccl.py`): GPU, non-colocated: a broadcast into the vLLM workers.
Each `send(named_weights, version)` returns the bytes moved.
"""
from __future__ import annotations

import abc
from multiprocessing import shared_memory
from typing import Iterable

import numpy as np

from dockyard.rollout import worker_ext

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


class ObjectStoreTransport(Transport):
  """For `RolloutFleet`: one `ray.put` shared by every engine (and kept for restarted engines)."""
  name = "object_store"

  def __init__(self, fleet):
    self.fleet = fleet

  def send(self, named, version):
    packed = worker_ext.pack_weights(_materialize(named))
    self.fleet.load_packed(packed, version)
    return sum(len(raw) for _, raw, _, _ in packed)


def write_shared_memory(named: Named) -> tuple[shared_memory.SharedMemory, list, int]:
  """Copies arrays into one new shared-memory block; returns (block, index, bytes)."""
  named = _materialize(named)
  index, offset = [], 0
  for name, array in named:
    offset = (offset + 63) // 64 * 64  # aligned for any dtype
    index.append((name, offset, array.dtype.str, tuple(array.shape)))
    offset += array.nbytes
  block = shared_memory.SharedMemory(create=True, size=max(offset, 1))
  for (name, array), (_, start, _, _) in zip(named, index):
    np.frombuffer(block.buf, dtype=array.dtype, count=array.size, offset=start)[:] = array.reshape(-1)
  return block, index, offset


class SharedMemoryTransport(Transport):
  """For an engine (or fleet) on this host with `load_shared_memory(block, index, version)`."""
  name = "shared_memory"

  def __init__(self, generator):
    self.generator = generator

  def send(self, named, version):
    block, index, nbytes = write_shared_memory(named)
    try:
      self.generator.load_shared_memory(block.name, index, version)
    finally:
      block.close()
      block.unlink()
    return nbytes


class HttpTransport(Transport):
  """POSTs the weights as one safetensors body to each receiver URL (`refit/http_receiver.py`)."""
  name = "http"

  def __init__(self, urls: Iterable[str], timeout_s: float = 600.0):
    self.urls = list(urls)
    if not self.urls:
      raise ValueError("HttpTransport needs at least one receiver URL")
    self.timeout_s = timeout_s

  def send(self, named, version):
    import httpx
    from safetensors.numpy import save
    body = save({n: np.ascontiguousarray(a) for n, a in _materialize(named)})
    for url in self.urls:
      r = httpx.post(f"{url.rstrip('/')}/weights", params={"version": int(version)}, content=body,
                     headers={"content-type": "application/octet-stream"}, timeout=self.timeout_s)
      if r.status_code != 200:
        raise RuntimeError(f"weight push to {url} failed: HTTP {r.status_code}: {r.text[:300]}")
    return len(body) * len(self.urls)
