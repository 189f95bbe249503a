"""Methods added to every vLLM worker (`worker_extension_cls`), called through `collective_rpc`.

vLLM refuses to ship plain Python functions to its workers, and tensors passed as rpc arguments
arrive as lists, so weights travel in `wire`'s format: raw bytes + dtype + shape, a shared-memory
block name, or a broadcast. Loading goes through the worker's `reload_weights` because CPU vLLM has
repacked its linear weights for oneDNN after start-up and a plain `model.load_weights` fails.
"""
from __future__ import annotations

import time
from typing import Iterable

import numpy as np

from dockyard.rollout.wire import GroupBroadcaster, read_shared_memory, unpack_weights


def _return_freed_heap() -> None:
  """Hands the heap pages a refit freed back to the OS (glibc `malloc_trim`).

  A refit through the object store deserializes every weight as a fresh `bytes` object in the
  actor and frees it after the reload; glibc keeps those pages in its arenas, so without this the
  actor's RssAnon grew by ~1.1x the refit's bytes per refit (SmolLM2-135M: ~0.6 GB a round,
  `bench/actor_memory.py`) and a 40-step run ended near the machine's memory; with it ~0.03x.
  A no-op where libc has no `malloc_trim` (not glibc).
  """
  import ctypes
  try:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
  except (OSError, AttributeError):
    pass


def _lap(start: float) -> tuple[float, float]:
  """(seconds since `start`, now)."""
  now = time.perf_counter()
  return now - start, now


class WorkerExtension:
  """Mixed into vLLM's worker class; `self` is the worker (has `model_runner`, `device`)."""

  def dockyard_load_weights(self, packed, refresh_tied_head: bool = True) -> int:
    """Loads packed (name, bytes, dtype, shape) weights; returns the number of tensors loaded.
    `refresh_tied_head=False` reproduces the stale-lm_head bug (for the canary's test only)."""
    return self._dockyard_reload(unpack_weights(packed), refresh_tied_head)

  def dockyard_load_shared_memory(self, block_name: str, index) -> int:
    """Loads weights from a shared-memory block written by the trainer side (no disk)."""
    return self._dockyard_reload(read_shared_memory(block_name, index))

  def dockyard_group_init(self, host: str, port: int, rank_offset: int, world_size: int, backend: str) -> int:
    """Joins the trainer's weight-broadcast group (`wire.GroupBroadcaster`) as rank_offset + rank."""
    rank = rank_offset + int(getattr(self, "rank", 0))
    device = self.device if backend == "nccl" else None
    self._dockyard_group = GroupBroadcaster(host, port, rank, world_size, backend, device)
    return rank

  def dockyard_group_receive(self, meta) -> int:
    """Receives the broadcast tensors listed in `meta` [(name, torch dtype, shape)] and loads them."""
    import torch
    group = getattr(self, "_dockyard_group", None)
    if group is None:
      raise RuntimeError("dockyard_group_receive before dockyard_group_init")

    def received():
      for name, dtype, shape in meta:
        t = torch.empty(tuple(shape), dtype=getattr(torch, dtype), device=group.device)
        group.broadcast(t, src=0)
        yield name, t
    return self._dockyard_reload_tensors(received())

  def dockyard_last_load_timings(self) -> dict[str, float]:
    """Seconds each part of this worker's last weight load took (`_dockyard_reload_tensors`):
    'reload_weights' (vLLM's reload: copies into freshly materialized layers and, interleaved
    with them, each layer's post-load processing, i.e. the oneDNN repack on CPU), 'tied_head',
    'experts' (the CPU repacks after it), 'heap_trim'; empty before the first load."""
    return dict(getattr(self, "_dockyard_timings", {}))

  def dockyard_param_names(self) -> list[str]:
    return [name for name, _ in self.model_runner.get_model().named_parameters()]

  def _dockyard_reload(self, named: Iterable[tuple[str, np.ndarray]], refresh_tied_head: bool = True) -> int:
    import warnings

    import torch

    def tensors():
      for name, array in named:
        with warnings.catch_warnings():
          # read-only views of rpc bytes: vLLM copies them into its parameters, never writes them
          warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
          yield name, torch.from_numpy(np.asarray(array))
    return self._dockyard_reload_tensors(tensors(), refresh_tied_head)

  def _dockyard_reload_tensors(self, named, refresh_tied_head: bool = True) -> int:
    count = 0

    def counted():
      nonlocal count
      for item in named:
        count += 1
        yield item
    timings = {}
    start = time.perf_counter()
    self.reload_weights(weights_iterator=counted())
    # reload_weights may stop early on an unknown name; an unconsumed broadcast would hang the
    # sender, and a partial load must not pass as a sync.
    for _ in counted():
      pass
    timings["reload_weights"], start = _lap(start)
    if refresh_tied_head:
      self._dockyard_refresh_tied_head()
    timings["tied_head"], start = _lap(start)
    self._dockyard_repack_experts()
    timings["experts"], start = _lap(start)
    _return_freed_heap()
    timings["heap_trim"], _ = _lap(start)
    self._dockyard_timings = timings
    return count

  def _dockyard_repack_experts(self) -> None:
    """CPU vLLM prepacks MoE expert weights into its grouped-GEMM layout once, at start-up; on a
    weight update its unquantized MoE method copies the new, unpacked weights into place and skips
    the prepack (it expects GPU kernels that read the plain layout), so the experts compute with
    garbage (refit canary: max |d logprob| 0.16 on the tiny Qwen3-MoE). Prepack them again."""
    if str(getattr(self, "device", "cpu")) != "cpu":
      return
    for module in self.model_runner.get_model().modules():
      kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
      experts = getattr(kernel, "fused_experts", None)
      if experts is not None and type(experts).__module__.endswith("cpu_moe"):
        experts.process_weights_after_loading(module)

  def _dockyard_refresh_tied_head(self) -> None:
    """With tied embeddings, CPU vLLM's packed lm_head copy stays stale after a reload."""
    model = self.model_runner.get_model()
    head = getattr(model, "lm_head", None)
    method = getattr(head, "quant_method", None)
    if head is not None and method is not None and hasattr(method, "process_weights_after_loading"):
      method.process_weights_after_loading(head)
