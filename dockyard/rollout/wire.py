"""The wire format of a weight update, shared by the sending side (`dockyard.refit`) and the
receiving vLLM workers (`worker_ext`): raw bytes + dtype + shape (what survives vLLM's rpc
serialization and Ray's object store), one POSIX shared-memory block with an index, and the
broadcast group. A leaf: it imports no other dockyard module, so the sender and the receiver can
both depend on it without depending on each other.
"""
from __future__ import annotations

import socket
from multiprocessing import shared_memory
from typing import Any, Iterable, Iterator

import numpy as np


def pack_weights(named: Iterable[tuple[str, np.ndarray]]) -> list[tuple[str, bytes, str, tuple[int, ...]]]:
  """(name, array) -> (name, raw bytes, dtype string, shape): survives vLLM's rpc serialization."""
  out = []
  for name, array in named:
    array = np.ascontiguousarray(array)
    out.append((name, array.tobytes(), array.dtype.str, tuple(array.shape)))
  return out


def unpack_weights(packed) -> Iterator[tuple[str, np.ndarray]]:
  for name, raw, dtype, shape in packed:
    yield name, np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape)


def read_shared_memory(block_name: str, index: list[tuple[str, int, str, tuple[int, ...]]]
                       ) -> Iterator[tuple[str, np.ndarray]]:
  """Yields copies of the arrays laid out in shared-memory block `block_name` at `index` offsets."""
  block = shared_memory.SharedMemory(name=block_name)
  try:
    for name, offset, dtype, shape in index:
      dtype = np.dtype(dtype)
      count = int(np.prod(shape)) if shape else 1
      view = np.frombuffer(block.buf, dtype=dtype, count=count, offset=offset).reshape(shape)
      yield name, view.copy()  # the copy lets the block close while vLLM keeps the tensor
      del view
  finally:
    block.close()


def write_shared_memory(named: list[tuple[str, np.ndarray]]) -> tuple[shared_memory.SharedMemory, list, int]:
  """Copies arrays into one new shared-memory block; returns (block, index, bytes)."""
  index, offset = [], 0
  for name, array in named:
    offset = (offset + 63) // 64 * 64  # aligned for any dtype
    index.append((name, offset, array.dtype.str, tuple(array.shape)))
    offset += array.nbytes
  block = shared_memory.SharedMemory(create=True, size=max(offset, 1))
  for (name, array), (_, start, _, _) in zip(named, index):
    # one strided copy straight into the block (a transposed view's reshape(-1) would copy twice)
    np.frombuffer(block.buf, dtype=array.dtype, count=array.size, offset=start).reshape(array.shape)[...] = array
  return block, index, offset


BACKENDS = ("nccl", "gloo")


class GroupBroadcaster:
  """broadcast(tensor, src) over a stateless group; `device` is where its tensors must live."""

  def __init__(self, host: str, port: int, rank: int, world_size: int, backend: str, device: Any = None):
    import torch
    from vllm.distributed.utils import StatelessProcessGroup
    if backend not in BACKENDS:
      raise ValueError(f"weight-transfer backend must be one of {BACKENDS}, got {backend!r}")
    self.rank, self.world_size, self.backend = rank, world_size, backend
    self.pg = StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=world_size)
    if backend == "nccl":
      from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
      self.device = torch.device(device if device is not None else "cuda")
      self.comm = PyNcclCommunicator(self.pg, device=self.device)
      if self.comm.disabled:  # PyNcclCommunicator turns itself off quietly without libnccl
        raise RuntimeError("NCCL weight transfer: PyNcclCommunicator is disabled (no NCCL library "
                           "or VLLM_DISABLE_PYNCCL); use config.refit.transport='object_store' on CPU")
    else:
      import torch.distributed as dist
      self.device = torch.device("cpu")
      store = dist.PrefixStore("dockyard_refit_gloo", self.pg.store)
      self.comm = dist.ProcessGroupGloo(store, rank, world_size)

  def broadcast(self, tensor, src: int = 0) -> None:
    if self.backend == "nccl":
      self.comm.broadcast(tensor, src=src)
    else:
      import torch.distributed as dist
      opts = dist.BroadcastOptions()
      opts.rootRank, opts.rootTensor = src, 0
      self.comm.broadcast([tensor], opts).wait()


def to_torch(array, device, contiguous: bool = True):
  """A trainer array as a torch tensor on `device`: DLPack for jax/torch-like arrays (no copy on
  the same device), `from_numpy` for NumPy (bfloat16 from ml_dtypes via a uint16 view).
  `contiguous=False`: a NumPy view keeps its strides on the CPU (no copy; for a loader that
  copies it into its own storage anyway)."""
  import torch
  if isinstance(array, np.ndarray):
    if array.dtype.name == "bfloat16":
      t = torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
    else:
      t = torch.from_numpy(array)
  elif hasattr(array, "__dlpack__"):
    t = torch.from_dlpack(array)
  else:
    raise TypeError(f"cannot send a {type(array).__name__} as a weight (want numpy or a DLPack array)")
  t = t.to(device)
  return t.contiguous() if contiguous else t


def torch_dtype_name(t) -> str:
  return str(t.dtype).removeprefix("torch.")


def free_port(host: str) -> int:
  with socket.socket() as s:
    s.bind((host, 0))
    return s.getsockname()[1]


