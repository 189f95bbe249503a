"""Methods added to every vLLM worker (`worker_extension_cls`), called through `collective_rpc`.

vLLM refuses to ship plain Python functions to its workers, and tensors passed as rpc arguments
arrive as lists, so weights travel in `wire`'s format: raw bytes + dtype + shape, a shared-memory
block name, or a broadcast; an in-process engine's worker takes the trainer's arrays as they are
(`dockyard_load_arrays`). CPU vLLM has packed its linear weights for oneDNN after start-up, so a
plain `model.load_weights` fails: a plain dense model on CPU loads through `DirectLoader` (pooled
staging weights, each layer repacked once complete; docs/refit_speed.md), everything else through
the worker's `reload_weights`.
"""
from __future__ import annotations

import time
from typing import Iterable

import numpy as np

from dockyard.rollout.wire import GroupBroadcaster, read_shared_memory, to_torch, unpack_weights


def return_freed_heap() -> None:
  """Hands the heap pages a refit freed back to the OS (glibc `malloc_trim`).

  glibc keeps freed pages in its arenas, one per thread that allocated them. A reload frees the
  previous copies (bytes deserialized from the wire, oneDNN's previous packed weights) and, in a
  Ray engine actor whose calls arrive on different threads, the next one allocates in another
  arena, so without this the actor's RssAnon grew by ~0.6-1.1x the refit's bytes per refit
  (SmolLM2-135M: 0.34-0.6 GB a round, `bench/actor_memory.py`) and a 40-step run ended near the
  machine's memory; with it ~0.003-0.03x. Costs ~50-80 ms for SmolLM2-135M (the pages fault in
  again at the next load). A no-op where libc has no `malloc_trim` (not glibc).
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

  def dockyard_load_arrays(self, named, refresh_tied_head: bool = True) -> int:
    """Loads (name, array) pairs handed over in this process (`VLLMEngine.update_weights` with
    the in-process core): no bytes copy on either side, and the heap is not trimmed (nothing
    here allocated a copy of the model; trimming would only make the next load fault its
    buffers in again). The `DirectLoader` takes the name map's strided views as they are (its
    staging weights share their layout, so its copy is a plain one); vLLM's reload gets them
    C-contiguous."""
    import warnings
    strided = self._dockyard_direct_loader() is not None

    def tensors():
      for name, array in named:
        with warnings.catch_warnings():
          # read-only host views of the trainer's arrays: loading copies them, never writes them
          warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
          yield name, to_torch(array, "cpu", contiguous=not strided)
    return self._dockyard_reload_tensors(tensors(), refresh_tied_head, trim_heap=False)

  def _dockyard_reload_tensors(self, named, refresh_tied_head: bool = True, trim_heap: bool = True) -> int:
    count = 0

    def counted():
      nonlocal count
      for item in named:
        count += 1
        yield item
    timings = {}
    start = time.perf_counter()
    direct = self._dockyard_direct_loader()
    if direct is not None:
      direct.load(counted(), refresh_tied_head, timings)
    else:
      self.reload_weights(weights_iterator=counted())
    # a load may stop early on an unknown name; an unconsumed broadcast would hang the sender,
    # and a partial load must not pass as a sync.
    for _ in counted():
      pass
    if direct is None:
      timings["reload_weights"], start = _lap(start)
      if refresh_tied_head:
        self._dockyard_refresh_tied_head()
      timings["tied_head"], start = _lap(start)
      self._dockyard_repack_experts()
      timings["experts"], start = _lap(start)
    else:
      start = time.perf_counter()
    if trim_heap:
      return_freed_heap()
      timings["heap_trim"], _ = _lap(start)
    self._dockyard_timings = timings
    return count

  def dockyard_set_direct_load(self, enabled: bool) -> bool:
    """Turns the `DirectLoader` off (every load through vLLM's `reload_weights`, as before it
    existed: bench/refit.py times both side by side) or back on; returns whether loads now go
    direct (False where it does not apply)."""
    self._dockyard_direct_enabled = bool(enabled)
    return self._dockyard_direct_loader() is not None

  def _dockyard_direct_loader(self) -> "DirectLoader | None":
    """The worker's `DirectLoader`, built on the first load; None where it does not apply or is
    turned off (then vLLM's `reload_weights` loads)."""
    if not getattr(self, "_dockyard_direct_enabled", True):
      return None
    if not hasattr(self, "_dockyard_direct"):
      self._dockyard_direct = DirectLoader.build(self)
    return self._dockyard_direct

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


class DirectLoader:
  """CPU vLLM's weight load without `reload_weights`' detours, for plain dense models.

  vLLM's reload (vllm/model_executor/model_loader/reload) puts every layer back on the meta
  device, materializes fresh full-size tensors for it, loads into those, runs the layer's
  post-load processing (on CPU: `dispatch_cpu_unquantized_gemm`, which packs the linear weight
  into a new oneDNN handle and drops the plain weight) and copies every processed tensor back
  into the old storage. On this machine that was ~78% of a SmolLM2-135M sync (docs/refit_speed.md):
  the fresh tensors page-fault in on every sync and each tensor is copied two or three times.

  Here the model's own `load_weights` (its name mapping and q/k/v, gate/up stacking) loads
  straight into:
  - for a linear layer whose weight CPU vLLM packed away: a staging weight from a pool of
    pre-faulted buffers, one per shape, reused across layers and syncs. When the layer's last
    shard arrives (a count of the elements loaded against its size, each shard id at most once;
    tensor parallel size 1),
    vLLM's own `process_weights_after_loading` packs it into a new oneDNN handle (the old
    handle is freed first, so the allocator can hand its memory to the new one) and the buffer
    goes back to the pool. Weights arrive layer by layer, so the pool holds a few buffers (one
    per linear shape), not a copy of the model.
  - for every other parameter (norms, the embedding, biases): its existing storage, in place.
  After the load, an lm_head whose weight was loaded (or that is tied to a loaded embedding) is
  repacked. The input embedding's own oneDNN handle is not: only a head's handle computes
  anything (`UnquantizedEmbeddingMethod.apply`); embedding lookups read the weight itself.
  Layers that receive nothing keep their packed weights (a LoRA merge sync sends a subset).

  `build` returns None, and the worker falls back to `reload_weights`, unless the device is the
  CPU, tensor and pipeline parallel sizes are 1, there is no quantization and no LoRA, and every
  module holding parameters is a packed unquantized linear, an unquantized embedding or head,
  or a module with plain parameters and no post-load processing (MoE experts, Mamba / DeltaNet
  layers and the like fall back). Correctness is checked where it always is: the refit canary.
  """

  def __init__(self, model, linears: dict, heads: list, vllm_config):
    self.model = model
    self.linears = linears          # layer -> _Staged
    self.heads = heads              # [(head module, tied: bool)]
    self.vllm_config = vllm_config
    self.pool: dict[tuple, list] = {}   # (shape, dtype, column-major) -> free staging buffers
    self.loaded_embeddings: set[int] = set()   # id(weight) of embedding weights loaded this sync
    self._timings: dict[str, float] = {}
    for module in model.modules():
      if _is_embedding(module):
        self._watch_embedding(module.weight)

  @classmethod
  def build(cls, worker) -> "DirectLoader | None":
    import torch
    from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
    config = worker.vllm_config
    parallel = config.parallel_config
    if (str(getattr(worker, "device", "cpu")) != "cpu" or config.lora_config is not None
        or config.model_config.quantization is not None
        or parallel.tensor_parallel_size != 1 or parallel.pipeline_parallel_size != 1):
      return None
    from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info
    from vllm.model_executor.model_loader.reload.sanitize import restore_layer_refs
    model = worker.model_runner.get_model()
    linears, heads = {}, []
    head = getattr(model, "lm_head", None)
    embedding_weights = {id(m.weight) for m in model.modules() if _is_embedding(m) and m is not head}
    for module in model.modules():
      own = dict(module.named_parameters(recurse=False))
      if not own:
        continue
      if any(p.is_meta or p.device.type != "cpu" for n, p in own.items() if n != "weight" or
             not isinstance(module, LinearBase)):
        return None
      if isinstance(module, LinearBase):
        meta = get_layerwise_info(module).restore_metadata[0].get("weight")
        if (type(module.quant_method) is not UnquantizedLinearMethod or not hasattr(module, "cpu_linear")
            or own["weight"].numel() != 0 or meta is None or meta.ndim != 2 or not meta.is_contiguous()):
          return None
        staged = torch.empty(0, dtype=meta.dtype)
        staged.__class__ = meta.__class__
        staged.__dict__ = meta.__dict__.copy()
        restore_layer_refs(staged, module)
        linears[module] = _Staged(module, staged, tuple(meta.shape), meta.dtype)
      elif _is_embedding(module):
        if type(module.quant_method).__name__ != "UnquantizedEmbeddingMethod":
          return None
        if module is head or type(module).__name__ == "ParallelLMHead":
          heads.append((module, id(module.weight) in embedding_weights))
      elif hasattr(module, "quant_method") or hasattr(module, "process_weights_after_loading"):
        return None   # a module with its own post-load processing: vLLM's reload knows it
    if not linears:
      return None
    loader = cls(model, linears, heads, config)
    for staged in linears.values():
      staged.staged.weight_loader = loader._staging_loader(staged, staged.staged.weight_loader)
    return loader

  def load(self, named, refresh_tied_head: bool, timings: dict[str, float]) -> None:
    """Loads (name, tensor) pairs through the model's `load_weights`; fills `timings` with
    'load' (copies into staging buffers and parameters), 'repack' (oneDNN packing of the linear
    layers), 'heads' (the lm_head repack) in seconds."""
    from vllm.config import set_current_vllm_config
    self._timings = {"repack": 0.0}
    self.loaded_embeddings.clear()
    packed_params = {}
    for layer, staged in self.linears.items():
      packed_params[layer] = layer.weight
      staged.loaded, staged.buffer = 0, None
      staged.shards.clear()
      layer.register_parameter("weight", staged.staged)
    start = time.perf_counter()
    try:
      with set_current_vllm_config(self.vllm_config):
        self.model.load_weights(named)
    finally:
      partial = []
      for layer, staged in self.linears.items():
        if layer.weight is staged.staged:   # never finished: its packed weight stays
          layer.register_parameter("weight", packed_params[layer])
          if staged.loaded:
            partial.append(staged)
            self._release(staged)
    if partial:
      raise ValueError(f"a partial weight load: {len(partial)} linear layers got only part of their "
                       f"weights (e.g. {partial[0].loaded} of {partial[0].numel} elements)")
    timings["load"] = time.perf_counter() - start - self._timings["repack"]
    timings["repack"] = self._timings["repack"]
    start = time.perf_counter()
    for head, tied in self.heads:
      if id(head.weight) in self.loaded_embeddings and (refresh_tied_head or not tied):
        head.quant_method.process_weights_after_loading(head)
    timings["heads"] = time.perf_counter() - start

  def _watch_embedding(self, weight) -> None:
    """Wraps an embedding weight's loader so that a load is noticed (its head then repacks)."""
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader
    original = getattr(weight, "weight_loader", default_weight_loader)
    loaded = self.loaded_embeddings

    def loader(param, loaded_weight, *args, **kwargs):
      loaded.add(id(param))
      return original(param, loaded_weight, *args, **kwargs)
    weight.weight_loader = loader

  def _staging_loader(self, staged: "_Staged", original):
    def loader(param, loaded_weight, *args, **kwargs):
      if staged.layer.weight is not staged.staged:
        raise ValueError(f"{type(staged.layer).__name__}: its weights arrived twice in one load")
      # A stacked layer (q/k/v, gate/up) takes one call per shard: a shard sent twice would
      # count towards the layer's size in place of a missing one and pack stale rows.
      shard = args[0] if args else kwargs.get("loaded_shard_id")
      if shard in staged.shards:
        raise ValueError(f"{type(staged.layer).__name__}: shard {shard!r} of one weight arrived twice "
                         "in one load")
      staged.shards.add(shard)
      if staged.buffer is None:
        staged.buffer = self._acquire(staged.shape, staged.dtype, _column_major(loaded_weight))
        param.data = staged.buffer
      result = original(param, loaded_weight, *args, **kwargs)
      staged.loaded += loaded_weight.numel()
      if staged.loaded >= staged.numel:
        self._pack(staged)
      return result
    return loader

  def _pack(self, staged: "_Staged") -> None:
    start = time.perf_counter()
    layer = staged.layer
    layer.cpu_linear = None   # frees the old oneDNN handle before the new one is allocated
    layer.quant_method.process_weights_after_loading(layer)   # packs; drops layer.weight
    self._release(staged)
    self._timings["repack"] += time.perf_counter() - start

  def _acquire(self, shape, dtype, column_major: bool):
    """A free staging weight of `shape` [out, in] in the layout of the weight that arrives:
    column-major for the JAX trainer's [in, out] kernel seen through the name map's transpose,
    row-major for a C-ordered HF tensor, so that loading it is a plain copy either way (oneDNN's
    packing reads both layouts)."""
    import torch
    free = self.pool.setdefault((shape, dtype, column_major), [])
    if free:
      return free.pop()
    return torch.empty(shape[::-1], dtype=dtype).t() if column_major else torch.empty(shape, dtype=dtype)

  def _release(self, staged: "_Staged") -> None:
    import torch
    self.pool[(staged.shape, staged.dtype, _column_major(staged.buffer))].append(staged.buffer)
    staged.buffer = None
    staged.staged.data = torch.empty(0, dtype=staged.dtype)


class _Staged:
  """A packed linear layer's staging weight (vLLM's parameter class and loader, pooled storage)."""

  def __init__(self, layer, staged, shape, dtype):
    self.layer, self.staged, self.shape, self.dtype = layer, staged, shape, dtype
    self.numel = int(np.prod(shape))
    self.loaded = 0
    self.shards: set = set()   # shard ids loaded this sync (None: an unstacked weight)
    self.buffer = None


def _column_major(t) -> bool:
  """Whether 2-D tensor `t` is laid out column-major (a transposed C-ordered array)."""
  return t.dim() == 2 and t.stride(0) == 1 and t.shape[0] > 1 and t.stride(1) >= t.shape[0]


def _is_embedding(module) -> bool:
  from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
  return isinstance(module, VocabParallelEmbedding)
