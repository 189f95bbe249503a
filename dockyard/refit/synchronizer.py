"""`WeightSynchronizer`: how the trainer's weights reach the engines.

One call, `refit()`, after each optimizer step: push the policy's weights as a new, strictly
larger version, run the refit canary (raises past its bound), ready the engines. The engines are
synced eagerly because both trajectory sources sample right after a step; there is no stale state to carry.
`create_weight_synchronizer` picks the transport from `config.refit.transport` ('auto': by
topology, from `config.cluster` and where the generator says its engines run).
"""
from __future__ import annotations

import time
from typing import Any

from dockyard.policy import Policy
from dockyard.refit.canary import RefitCanary
from dockyard.refit.transports import (InProcessTransport, ObjectStoreTransport,
                                       SharedMemoryTransport, Transport)
from dockyard.rollout.base import Generator

TRANSPORTS = ("auto", "inprocess", "object_store", "shared_memory", "nccl")


class WeightSynchronizer:

  def __init__(self, policy: Policy, generator: Generator, transport: Transport,
               canary: RefitCanary | None = None, version: int | None = None):
    self.policy = policy
    self.generator = generator
    self.transport = transport
    self.canary = canary
    self._version = int(generator.weight_version if version is None else version)
    self.last_metrics: dict[str, float] = {}

  @property
  def version(self) -> int:
    """The weight version last pushed (monotonically increasing)."""
    return self._version

  def refit(self) -> dict[str, float]:
    """Pushes the policy's weights as version+1, checks them (the canary), readies the engines;
    returns the sync's metrics."""
    metrics = self.sync_weights()
    self.generator.prepare_for_generation()
    return metrics

  def sync_weights(self) -> dict[str, float]:
    """Pushes the policy's weights as version+1, then runs the canary (raises past its bound)."""
    version = self._version + 1
    start = time.perf_counter()
    nbytes = self.transport.send(self.policy.named_weights(), version)
    elapsed = time.perf_counter() - start
    self._version = version
    metrics = {"refit/version": float(version), "refit/time_s": elapsed, "refit/bytes": float(nbytes),
               "refit/gbytes_per_s": nbytes / max(elapsed, 1e-9) / 1e9}
    if self.canary is not None:
      start = time.perf_counter()
      canary = self.canary.check(self.policy, self.generator, version)
      metrics.update({f"refit/canary/{k}": v for k, v in canary.items()})
      metrics["refit/canary/time_s"] = time.perf_counter() - start
    self.last_metrics = metrics
    return metrics


def pick_transport_name(config: Any, generator: Generator) -> str:
  """'auto' by topology: engines in this process -> inprocess; engines in other processes (the
  Ray fleet): accelerators and not colocated (`config.cluster`) -> nccl, else object_store (Ray
  moves one object to every node)."""
  name = config.refit.transport
  if name not in TRANSPORTS:
    raise ValueError(f"config.refit.transport: unknown transport {name!r}; choose from {TRANSPORTS}")
  if name != "auto":
    return name
  if generator.in_process:
    return "inprocess"
  cluster = config.cluster
  if cluster.accelerators_per_node > 0 and not cluster.colocated:
    return "nccl"
  return "object_store"


def make_transport(name: str, generator: Generator) -> Transport:
  if name == "inprocess":
    if not generator.in_process:
      raise ValueError("config.refit.transport='inprocess' needs an engine in this process; the "
                       "generator's engines run in other processes (use 'object_store', "
                       "'shared_memory' or 'nccl')")
    return InProcessTransport(generator)
  if name == "object_store":
    if generator.in_process:
      raise ValueError("config.refit.transport='object_store' needs engines in other processes (a "
                       "RolloutFleet); this generator's engine is in this process (use 'inprocess')")
    return ObjectStoreTransport(generator)
  if name == "shared_memory":
    return SharedMemoryTransport(generator)
  if name == "nccl":
    if generator.in_process:
      raise ValueError("config.refit.transport='nccl' needs engines in other processes (a RolloutFleet)")
    from dockyard.refit.nccl import NcclTransport
    return NcclTransport(generator)
  raise ValueError(f"config.refit.transport: unknown transport {name!r}; choose from {TRANSPORTS}")


def create_weight_synchronizer(config: Any, policy: Policy, generator,
                               canary: RefitCanary | None = None) -> WeightSynchronizer:
  """The synchronizer for `config` (transport from `config.refit.transport`, canary from
  `config.refit.canary`: random probe ids below the engine's vocabulary unless one is given)."""
  transport = make_transport(pick_transport_name(config, generator), generator)
  canary_cfg = config.refit.canary
  if canary is None and canary_cfg.enabled:
    canary = RefitCanary.random(generator.vocab_size, float(canary_cfg.max_abs_logprob_delta))
  return WeightSynchronizer(policy, generator, transport, canary)
