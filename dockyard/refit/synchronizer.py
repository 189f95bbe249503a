"""`WeightSynchronizer`: when and how the trainer's weights reach the engines.

State machine: the GRPO loop calls `mark_stale()` after each optimizer step; before the next
generation `prepare_for_generation()` syncs if stale (a new, strictly larger weight version),
runs the refit canary, and readies the engine. `create_weight_synchronizer` picks the transport
from `config.refit.transport` ('auto' picks by topology).
"""
from __future__ import annotations

import time
from typing import Any

from dockyard.policy import Policy
from dockyard.refit.canary import RefitCanary
from dockyard.refit.transports import (HttpTransport, InProcessTransport, ObjectStoreTransport,
                                       SharedMemoryTransport, Transport)

TRANSPORTS = ("auto", "inprocess", "object_store", "shared_memory", "http", "nccl")


class WeightSynchronizer:

  def __init__(self, policy: Policy, generator, transport: Transport, canary: RefitCanary | None = None,
               version: int | None = None):
    self.policy = policy
    self.generator = generator
    self.transport = transport
    self.canary = canary
    self._version = int(generator.weight_version if version is None else version)
    self._stale = False
    self.last_metrics: dict[str, float] = {}

  @property
  def version(self) -> int:
    """The weight version last pushed (monotonically increasing)."""
    return self._version

  @property
  def is_stale(self) -> bool:
    return self._stale

  def mark_stale(self) -> None:
    """The trainer's weights changed: the engines must be synced before they sample again."""
    self._stale = True

  def sync_weights(self) -> dict[str, float]:
    """Pushes the policy's weights as version+1, then runs the canary (raises past its bound)."""
    version = self._version + 1
    start = time.perf_counter()
    nbytes = self.transport.send(self.policy.named_weights(), version)
    elapsed = time.perf_counter() - start
    self._version = version
    self._stale = False
    metrics = {"refit/version": float(version), "refit/time_s": elapsed, "refit/bytes": float(nbytes),
               "refit/gbytes_per_s": nbytes / max(elapsed, 1e-9) / 1e9}
    if self.canary is not None:
      start = time.perf_counter()
      canary = self.canary.check(self.policy, self.generator, version)
      metrics.update({f"refit/canary/{k}": v for k, v in canary.items()})
      metrics["refit/canary/time_s"] = time.perf_counter() - start
    self.last_metrics = metrics
    return metrics

  def prepare_for_generation(self) -> dict[str, float]:
    """Syncs if stale, then readies the engines; returns the sync's metrics ({} if none)."""
    metrics = self.sync_weights() if self._stale else {}
    self.generator.prepare_for_generation()
    return metrics


def _is_fleet(generator) -> bool:
  from dockyard.rollout.fleet import RolloutFleet
  return isinstance(generator, RolloutFleet)


def pick_transport_name(config: Any, generator) -> str:
  """'auto' by topology: colocated in-process engine -> inprocess; a fleet: GPUs and not
  colocated -> nccl, several nodes -> object_store (Ray moves objects between nodes), else
  object_store; an engine served over HTTP (has `receiver_urls`) -> http."""
  name = config.refit.transport
  if name not in TRANSPORTS:
    raise ValueError(f"config.refit.transport: unknown transport {name!r}; choose from {TRANSPORTS}")
  if name != "auto":
    return name
  if getattr(generator, "receiver_urls", None):
    return "http"
  if not _is_fleet(generator):
    return "inprocess"
  cl = config.cluster
  if cl.accelerators_per_node > 0 and not cl.colocated:
    return "nccl"
  return "object_store"


def make_transport(name: str, generator) -> Transport:
  if name == "inprocess":
    if _is_fleet(generator):
      raise ValueError("config.refit.transport='inprocess' needs an engine in this process; the "
                       "generator is a Ray fleet (use 'object_store', 'shared_memory' or 'nccl')")
    return InProcessTransport(generator)
  if name == "object_store":
    if not _is_fleet(generator):
      raise ValueError("config.refit.transport='object_store' needs a RolloutFleet generator")
    return ObjectStoreTransport(generator)
  if name == "shared_memory":
    return SharedMemoryTransport(generator)
  if name == "http":
    urls = getattr(generator, "receiver_urls", None)
    if not urls:
      raise ValueError("config.refit.transport='http' needs a generator with `receiver_urls` "
                       "(engines serving dockyard.refit.http_receiver)")
    return HttpTransport(urls)
  if name == "nccl":
    from dockyard.refit.nccl import NcclTransport
    return NcclTransport(generator)
  raise ValueError(f"config.refit.transport: unknown transport {name!r}; choose from {TRANSPORTS}")


def create_weight_synchronizer(config: Any, policy: Policy, generator,
                               canary: RefitCanary | None = None) -> WeightSynchronizer:
  """The synchronizer for `config` (transport from `config.refit.transport`, canary from
  `config.refit.canary`: random probe ids below the engine's vocabulary unless one is given)."""
  transport = make_transport(pick_transport_name(config, generator), generator)
  c = config.refit.canary
  if canary is None and c.enabled:
    canary = RefitCanary.random(generator.vocab_size, float(c.max_abs_logprob_delta))
  return WeightSynchronizer(policy, generator, transport, canary)
