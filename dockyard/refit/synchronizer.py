"""`WeightSynchronizer`: how the trainer's weights reach the engines.

One call, `refit()`, after each optimizer step: push the policy's weights as a new, strictly
larger version, run the refit canary (raises past its bound), ready the engines. The engines are
synced eagerly because both trajectory sources sample right after a step; there is no stale state to carry.
`create_weight_synchronizer` picks the transport from `config.refit.transport` ('auto': by
topology, from `config.cluster` and where the generator says its engines run).

Under LoRA (`config.policy.lora`), `config.refit.lora_mode` picks what a sync sends:
- 'merge': the first sync sends every weight; later ones only the adapted projections, merged
  (`W + scale * B A`, `Policy.named_weights(touched_only=True)`): the base is frozen, so every
  other tensor in the engine is already right. Through any transport.
- 'adapter': the adapters alone, as a PEFT directory that vLLM's LoRA support serves on top of
  the base (`Generator.load_lora_adapter`; the engines are built with LoRA on). No transport:
  the directory (or its files, through the object store, for a fleet) is what moves.
Either way the canary runs after the sync, and its tracking check catches a sync that changed
nothing (`dockyard.refit.canary`).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any

from dockyard.policy import Policy
from dockyard.refit.canary import RefitCanary
from dockyard.refit.transports import (InProcessTransport, ObjectStoreTransport,
                                       SharedMemoryTransport, Transport)
from dockyard.rollout.base import Generator

TRANSPORTS = ("auto", "inprocess", "object_store", "shared_memory", "nccl")
LORA_MODES = (None, "merge", "adapter")


class WeightSynchronizer:

  def __init__(self, policy: Policy, generator: Generator, transport: Transport,
               canary: RefitCanary | None = None, version: int | None = None,
               lora_mode: str | None = None):
    """`lora_mode`: None (every sync sends every weight), 'merge' or 'adapter' (module docstring)."""
    if lora_mode not in LORA_MODES:
      raise ValueError(f"config.refit.lora_mode: must be one of {LORA_MODES[1:]}, got {lora_mode!r}")
    if lora_mode == "adapter" and not generator.lora_enabled:
      raise ValueError("config.refit.lora_mode='adapter': the generator's engines were built without "
                       "LoRA support (VLLMEngine(lora_rank=...); a RolloutFleet turns it on from "
                       "policy.lora + refit.lora_mode)")
    self.policy = policy
    self.generator = generator
    self.transport = transport
    self.canary = canary
    self.lora_mode = lora_mode
    self._full_synced = False
    self._adapter_root: str | None = None
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
    if self.lora_mode == "adapter":
      nbytes = self._send_adapter(version)
    elif self.lora_mode == "merge" and self._full_synced:
      nbytes = self.transport.send(self.policy.named_weights(touched_only=True), version)
    else:
      nbytes = self.transport.send(self.policy.named_weights(), version)
      self._full_synced = True
    elapsed = time.perf_counter() - start
    self._version = version
    metrics = {"refit/version": float(version), "refit/time_s": elapsed, "refit/bytes": float(nbytes),
               "refit/gbytes_per_s": nbytes / max(elapsed, 1e-9) / 1e9}
    # A Ray fleet: the versions its engines reported after this load (checked equal to `version`
    # there) and how many engines it has restarted, so a restart shows up next to its next sync.
    versions = getattr(self.generator, "engine_versions", None)
    if versions:
      metrics["refit/engine_version_min"] = float(min(versions))
    if hasattr(self.generator, "restarts"):
      metrics["refit/engine_restarts"] = float(self.generator.restarts)
    if self.canary is not None:
      start = time.perf_counter()
      canary = self.canary.check(self.policy, self.generator, version)
      metrics.update({f"refit/canary/{k}": v for k, v in canary.items()})
      metrics["refit/canary/time_s"] = time.perf_counter() - start
    self.last_metrics = metrics
    return metrics

  def _send_adapter(self, version: int) -> int:
    """Writes the adapters as a PEFT directory and has the engines serve it; the previous
    version's directory goes once the new one is loaded. Returns the adapter's tensor bytes."""
    if self._adapter_root is None:
      self._adapter_root = tempfile.mkdtemp(prefix="dockyard-lora-refit-")
    path = os.path.join(self._adapter_root, f"v{version}")
    nbytes = self.policy.save_adapter(path)
    self.generator.load_lora_adapter(path, version)
    for name in os.listdir(self._adapter_root):
      if name != f"v{version}":
        shutil.rmtree(os.path.join(self._adapter_root, name), ignore_errors=True)
    return nbytes

  def close(self) -> None:
    if self._adapter_root is not None:
      shutil.rmtree(self._adapter_root, ignore_errors=True)
      self._adapter_root = None


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


def make_canary(canary_cfg: Any, vocab_size: int) -> RefitCanary | None:
  """The canary `config.refit.canary` asks for (random probe ids below `vocab_size`), or None when
  it is disabled."""
  if not canary_cfg.enabled:
    return None
  mean = float(canary_cfg.max_mean_abs_logprob_delta)
  return RefitCanary.random(vocab_size, float(canary_cfg.max_abs_logprob_delta),
                            max_mean_abs_logprob_delta=mean if mean > 0 else None)


def create_weight_synchronizer(config: Any, policy: Policy, generator,
                               canary: RefitCanary | None = None) -> WeightSynchronizer:
  """The synchronizer for `config` (transport from `config.refit.transport`, canary from
  `config.refit.canary`: random probe ids below the engine's vocabulary unless one is given;
  under `config.policy.lora`, what each sync sends from `config.refit.lora_mode`)."""
  transport = make_transport(pick_transport_name(config, generator), generator)
  if canary is None:
    canary = make_canary(config.refit.canary, generator.vocab_size)
  lora = config.policy.get("lora") if "policy" in config else None
  lora_mode = config.refit.get("lora_mode", "merge") if lora is not None and lora.enabled else None
  return WeightSynchronizer(policy, generator, transport, canary, lora_mode=lora_mode)
