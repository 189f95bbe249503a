"""The collective transport: a broadcast from the trainer (rank 0) into every vLLM worker.

On GPU this is NCCL: vLLM's `StatelessProcessGroup` (a TCPStore rendezvous that leaves
`torch.distributed`'s global group alone, which vLLM's workers already use) plus its
`PyNcclCommunicator`; trainer arrays (jax arrays on device) become torch tensors through DLPack
without a copy. On CPU the same protocol runs over a gloo group built on the same store, which is
how the tests exercise it. Tensors stream: each worker receives tensor k while vLLM's
`reload_weights` is loading tensor k-1, so no full second copy of the model is held.
Unverified on GPU here: see docs/hardware-validation.md.
"""
from __future__ import annotations

import socket
from typing import Any

import numpy as np

from dockyard.refit.transports import Transport

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


def to_torch(array, device):
  """A trainer array as a torch tensor on `device`: DLPack for jax/torch-like arrays (no copy on
  the same device), `from_numpy` for NumPy (bfloat16 from ml_dtypes via a uint16 view)."""
  import torch
  if isinstance(array, np.ndarray):
    if array.dtype.name == "bfloat16":
      t = torch.from_numpy(np.ascontiguousarray(array).view(np.uint16)).view(torch.bfloat16)
    else:
      t = torch.from_numpy(np.ascontiguousarray(array))
  elif hasattr(array, "__dlpack__"):
    t = torch.from_dlpack(array)
  else:
    raise TypeError(f"cannot send a {type(array).__name__} as a weight (want numpy or a DLPack array)")
  return t.to(device).contiguous()


def torch_dtype_name(t) -> str:
  return str(t.dtype).removeprefix("torch.")


def free_port(host: str) -> int:
  with socket.socket() as s:
    s.bind((host, 0))
    return s.getsockname()[1]


class NcclTransport(Transport):
  """Trainer side, for a `RolloutFleet`: rank 0 of a group with every engine's workers."""
  name = "nccl"

  def __init__(self, fleet, backend: str | None = None, host: str | None = None):
    from dockyard.rollout.fleet import RolloutFleet
    import torch
    if not isinstance(fleet, RolloutFleet):
      raise ValueError("config.refit.transport='nccl' needs a RolloutFleet (engines in other processes)")
    self.fleet = fleet
    self.backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    self.host = host or _node_ip()
    self.group: GroupBroadcaster | None = None
    self._restarts_seen = -1

  def _connect(self) -> None:
    """(Re)builds the group: first use, or after the fleet restarted an engine."""
    ray = self.fleet._ray
    tp = int(self.fleet.rollout["tensor_parallel_size"])
    world = 1 + len(self.fleet.actors) * tp
    port = free_port(self.host)
    refs = [a.nccl_init.remote(self.host, port, 1 + i * tp, world, self.backend)
            for i, a in enumerate(self.fleet.actors)]
    self.group = GroupBroadcaster(self.host, port, 0, world, self.backend)
    ray.get(refs)
    self._restarts_seen = self.fleet.restarts

  def send(self, named, version):
    if self.group is None or self._restarts_seen != self.fleet.restarts:
      self._connect()
    ray = self.fleet._ray
    tensors = [(name, to_torch(a, self.group.device)) for name, a in named]
    if not tensors:
      raise ValueError("named_weights yielded nothing: no weights to sync")
    meta = [(name, torch_dtype_name(t), tuple(t.shape)) for name, t in tensors]
    refs = [a.nccl_receive.remote(meta, version) for a in self.fleet.actors]
    for _, t in tensors:
      self.group.broadcast(t, src=0)
    ray.get(refs)
    self.fleet.mark_loaded_out_of_band(version)
    return sum(t.numel() * t.element_size() for _, t in tensors)


def _node_ip() -> str:
  try:
    import ray
    if ray.is_initialized():
      return ray.util.get_node_ip_address()
  except Exception:  # no Ray: loopback is right for one host
    pass
  return "127.0.0.1"
