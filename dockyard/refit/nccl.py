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

from dockyard.refit.transports import Transport
from dockyard.rollout.wire import GroupBroadcaster, free_port, to_torch, torch_dtype_name


class NcclTransport(Transport):
  """Trainer side, for engines in other processes (`RolloutFleet`): rank 0 of a group with every
  engine's workers, through the fleet's public broadcast methods."""
  name = "nccl"

  def __init__(self, fleet, backend: str | None = None, host: str | None = None):
    import torch
    self.fleet = fleet
    self.backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    self.host = host or _node_ip()
    self.group: GroupBroadcaster | None = None

  def _connect(self) -> None:
    """(Re)builds the group: first use, or after the fleet restarted an engine."""
    port = free_port(self.host)
    wait = self.fleet.join_broadcast_group(self.host, port, self.backend)
    self.group = GroupBroadcaster(self.host, port, 0, 1 + self.fleet.broadcast_ranks, self.backend)
    wait()

  def send(self, named, version):
    if self.group is None or not self.fleet.broadcast_group_current:
      self._connect()
    tensors = [(name, to_torch(a, self.group.device)) for name, a in named]
    if not tensors:
      raise ValueError("named_weights yielded nothing: no weights to sync")
    meta = [(name, torch_dtype_name(t), tuple(t.shape)) for name, t in tensors]
    wait = self.fleet.receive_broadcast(meta, version)
    for _, t in tensors:
      self.group.broadcast(t, src=0)
    wait()
    return sum(t.numel() * t.element_size() for _, t in tensors)


def _node_ip() -> str:
  try:
    import ray
    if ray.is_initialized():
      return ray.util.get_node_ip_address()
  except Exception:  # no Ray: loopback is right for one host
    pass
  return "127.0.0.1"
