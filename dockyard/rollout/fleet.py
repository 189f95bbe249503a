"""The rollout fleet: N vLLM engines as Ray actors, one placement group (PACK) per engine.

`RolloutFleet` implements `Generator`: `generate` splits prompts over the engines and blocks;
`agenerate` sends one request to the least-loaded engine and is awaitable (many in flight for the
async GRPO loop). An engine that dies (`ray.kill`, OOM, node loss) is restarted in its placement
group, gets the latest weights the fleet holds, and its in-flight requests are retried.
Every weight load checks the version each engine reports back (an engine not at the version just
pushed is an error). A restarted engine the fleet cannot bring to its current version (the
shared-memory and broadcast transports keep no copy of the weights) is `stale`: it serves no
request until the next weight sync reaches it, and with every engine stale, generating is an
error; its checkpoint's weights are never sampled from.
Ray is started locally unless `config.run.ray_address` names a cluster.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import queue
import threading
import time
from typing import Any, Callable, Iterable, Sequence

import numpy as np

import dockyard
from dockyard import ray_utils
from dockyard.rollout.base import Completion, Generator, SamplingParams

log = logging.getLogger(__name__)

MAX_CONCURRENCY = 64   # actor threads: queued generate calls + weight loads + scoring
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(dockyard.__file__)))


class EngineActorImpl:
  """The body of one engine actor: a `VLLMEngine` in the actor's process.

  Calls arrive on up to `MAX_CONCURRENCY` threads; generate requests are queued and one batcher
  thread hands everything queued to vLLM as one batch, so many small `agenerate` calls in flight
  share the engine's continuous batching instead of running one after another.
  """

  def __init__(self, model_path: str, rollout: dict, seed: int, version: int, lora_rank: int = 0,
               lora_targets: tuple = ()):
    from dockyard.rollout.vllm_engine import VLLMEngine
    self.engine = VLLMEngine(model_path, rollout, seed=seed, version=version, lora_rank=lora_rank,
                             lora_targets=lora_targets)
    self._lora_dirs: list[str] = []
    self.batches = 0
    self.in_batch = 0      # requests inside the running vLLM batch
    self.busy_s = 0.0      # seconds inside vLLM batches (the engine's utilization; bench/async_vs_sync.py)
    self._queue: queue.Queue = queue.Queue()
    threading.Thread(target=self._batch_loop, daemon=True).start()

  def info(self) -> dict:
    return {"pid": os.getpid(), "version": self.engine.weight_version, "vocab_size": self.engine.vocab_size,
            "batches": self.batches, "in_batch": self.in_batch, "busy_s": self.busy_s}

  def generate(self, prompts, n, sampling):
    self.engine.check_request(prompts, n, sampling)  # a bad request fails alone, not its batch
    done = concurrent.futures.Future()
    self._queue.put(((prompts, n, sampling), done))
    return done.result()

  def _batch_loop(self):
    while True:
      items = [self._queue.get()]
      while True:
        try:
          items.append(self._queue.get_nowait())
        except queue.Empty:
          break
      self.in_batch = len(items)
      t0 = time.perf_counter()
      try:
        outs = self.engine.generate_many([request for request, _ in items])
        self.batches += 1
      except BaseException as e:  # hand the failure to every caller of this batch
        for _, done in items:
          done.set_exception(e)
        continue
      finally:
        self.in_batch = 0
        self.busy_s += time.perf_counter() - t0
      for (_, done), out in zip(items, outs):
        done.set_result(out)

  def prompt_logprobs(self, sequences):
    return self.engine.prompt_logprobs(sequences)

  def update_weights(self, named, version):
    """(name, array) pairs out of the object store: read-only views of the shared object, no copy
    until the engine's loader copies each into its own storage. The engine's worker runs in this
    process, so the heap it freed is trimmed here (`worker_ext.return_freed_heap`)."""
    from dockyard.rollout.worker_ext import return_freed_heap
    self.engine.update_weights(named, version)
    return_freed_heap()
    return self.engine.weight_version

  def load_shared_memory(self, block_name, index, version):
    self.engine.load_shared_memory(block_name, index, version)
    return self.engine.weight_version

  def load_lora_adapter(self, files: dict, version):
    """Writes the adapter's files (name -> bytes) to a directory of this actor's host and serves
    it; the previous adapter's directory goes once vLLM has dropped it."""
    import shutil
    import tempfile
    path = tempfile.mkdtemp(prefix=f"dockyard-lora-v{int(version)}-")
    for name, raw in files.items():
      with open(os.path.join(path, os.path.basename(name)), "wb") as f:
        f.write(raw)
    self.engine.load_lora_adapter(path, version)
    self._lora_dirs.append(path)
    while len(self._lora_dirs) > 1:
      shutil.rmtree(self._lora_dirs.pop(0), ignore_errors=True)
    return self.engine.weight_version

  def nccl_init(self, host, port, rank_offset, world_size, backend):
    return self.engine.collective_rpc("dockyard_group_init", (host, port, rank_offset, world_size, backend))

  def nccl_receive(self, meta, version):
    counts = self.engine.collective_rpc("dockyard_group_receive", (meta,))
    self.engine.set_version(version)
    return counts

  def prepare_for_generation(self):
    self.engine.prepare_for_generation()


def _placement(rollout, on_gpu: bool):
  """One PACK placement group per engine: its tensor-parallel ranks on one node, an inference
  node where the cluster advertises fleet roles (`ray_utils.role_bundle`)."""
  import ray
  from ray.util.placement_group import placement_group
  tp = int(rollout["tensor_parallel_size"])
  cpus = float(rollout["cpus_per_engine"])
  bundle = ray_utils.role_bundle(ray, "inference", {"CPU": cpus / tp, "GPU": 1.0} if on_gpu else {"CPU": cpus / tp})
  return placement_group([dict(bundle) for _ in range(tp)], strategy="PACK")


class RolloutFleet(Generator):
  in_process = False   # engines are Ray actors: weights travel serialized or broadcast

  def __init__(self, config: Any, model_path: str, num_cpus: int | None = None):
    ray = ray_utils.init_ray(config.run.ray_address, num_cpus=num_cpus)
    self._ray = ray
    self.rollout = dict(config.rollout)
    n = int(self.rollout["num_engines"])
    if n < 1:
      raise ValueError(f"config.rollout.num_engines must be >= 1, got {n}")
    if not float(self.rollout["cpus_per_engine"]) > 0:
      raise ValueError(f"config.rollout.cpus_per_engine must be > 0, got {self.rollout['cpus_per_engine']}")
    self.model_path = model_path
    self.seed = int(config.run.seed)
    self.on_gpu = int(config.cluster.accelerators_per_node) > 0
    self.max_restarts = int(self.rollout.get("max_restarts", 3))
    self._version = 0
    self._latest_weights = None      # ObjectRef of the newest weights, for restarted engines
    self._latest_adapter = None      # ObjectRef of the newest LoRA adapter's files (lora_mode='adapter')
    # vLLM's LoRA support, when refit ships adapters (refit.lora_mode='adapter' under policy.lora).
    lora, refit = config.policy.get("lora") if "policy" in config else None, config.get("refit")
    adapter_mode = bool(lora and lora.enabled and refit and refit.get("lora_mode") == "adapter")
    self.lora_rank = int(lora.rank) if adapter_mode else 0
    self.lora_targets = tuple(lora.targets) if adapter_mode else ()
    self.lora_enabled = adapter_mode
    self._lock = threading.Lock()
    self.restarts = 0
    self.engine_versions = [0] * n   # what each engine reported after its last weight load
    self.stale: set[int] = set()     # restarted engines behind the fleet's version: serve nothing
    self._group_restarts = -1      # `restarts` when the broadcast group was last joined
    self.in_flight = [0] * n
    self.served = [0] * n            # requests completed per engine
    self.placement_groups = [_placement(self.rollout, self.on_gpu) for _ in range(n)]
    ray.get([pg.ready() for pg in self.placement_groups])
    self.actors = [self._start(i) for i in range(n)]
    infos = ray.get([a.info.remote() for a in self.actors])
    self.vocab_size = infos[0]["vocab_size"]

  # -- engines ---------------------------------------------------------------------------------
  def _start(self, i: int, version: int = 0):
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    tp = int(self.rollout["tensor_parallel_size"])
    # tp > 1: the actor only drives; vLLM's Ray executor places the ranks in the same group.
    resources = ({"num_gpus": 1.0 if self.on_gpu else 0, "num_cpus": self.rollout["cpus_per_engine"] / tp}
                 if tp == 1 else {"num_cpus": 0})
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "VLLM_CPU_KVCACHE_SPACE": str(int(self.rollout["cpu_kvcache_space_gib"])),
           # every refit logs several INFO lines (and benign 'Failed to load weights' warnings for
           # tied/rotary modules); WARNING+ of our own code still reaches the driver.
           "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"),
           # the actor imports this checkout's dockyard, whatever is installed
           "PYTHONPATH": os.pathsep.join(p for p in (_REPO_ROOT, os.environ.get("PYTHONPATH", "")) if p)}
    cls = self._ray.remote(EngineActorImpl)
    return cls.options(
        name=None, max_concurrency=MAX_CONCURRENCY, max_restarts=0, runtime_env={"env_vars": env},
        scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=self.placement_groups[i], placement_group_bundle_index=0,
            placement_group_capture_child_tasks=True),
        **resources).remote(self.model_path, self.rollout, self.seed + i, version, self.lora_rank,
                            self.lora_targets)

  def _restart(self, i: int, dead) -> None:
    """Replaces engine `i` if it is still `dead` (concurrent failures restart it once)."""
    with self._lock:
      if self.actors[i] is not dead:
        return
      if self.restarts >= self.max_restarts * len(self.actors):
        raise RuntimeError(f"rollout engine {i} died and the fleet already restarted "
                           f"{self.restarts} times (config.rollout.max_restarts={self.max_restarts})")
      self.restarts += 1
      try:
        self._ray.kill(dead)
      except Exception:  # already gone
        pass
      actor = self._start(i)
      version = self._ray.get(actor.info.remote())["version"]
      if self._latest_weights is not None:
        version = self._ray.get(actor.update_weights.remote(self._latest_weights, self._version))
      if self._latest_adapter is not None:
        version = self._ray.get(actor.load_lora_adapter.remote(self._latest_adapter, self._version))
      self.actors[i] = actor
      self.in_flight[i] = 0
      self.engine_versions[i] = version
      log.warning("rollout engine %d died; restarted it (restart %d) at weight version %d",
                  i, self.restarts, version)
      if version != self._version:   # never sample with weights older than the fleet's
        self.stale.add(i)
        log.warning("rollout engine %d is behind the fleet's weight version %d and the transport "
                    "keeps no copy of it: the engine serves nothing until the next weight sync", i,
                    self._version)

  def _serving(self) -> list[int]:
    """The engines at the fleet's weight version; raises when there is none."""
    serving = [i for i in range(len(self.actors)) if i not in self.stale]
    if not serving:
      raise RuntimeError(
          f"no rollout engine holds the fleet's weight version {self._version}: engines "
          f"{sorted(self.stale)} were restarted and the weight transport (shared memory or "
          f"broadcast) keeps no copy of the weights to give them; they serve again after the next "
          f"weight sync (refit.transport='object_store' restores them at once)")
    return serving

  def _pick(self, i: int) -> int:
    """Engine `i`, or the least-loaded serving engine when `i` is stale."""
    return i if i not in self.stale else min(self._serving(), key=lambda j: self.in_flight[j])

  def _loaded(self, versions: Sequence[int], version: int) -> None:
    """Records the versions the engines reported after a load; raises unless all are `version`."""
    versions = [int(v) for v in versions]
    if any(v != int(version) for v in versions):
      raise RuntimeError(f"weight version {version} was pushed but the engines report {versions}")
    self.engine_versions = versions
    self.stale.clear()

  def engine_info(self) -> list[dict]:
    """Per engine: pid, weight version, vocab size, vLLM batches run, seconds inside them."""
    return self._ray.get([a.info.remote() for a in self.actors])

  def engine_pids(self) -> list[int]:
    return [info["pid"] for info in self.engine_info()]

  # -- Generator -------------------------------------------------------------------------------
  @property
  def weight_version(self) -> int:
    return self._version

  def generate(self, prompt_ids: Sequence[Sequence[int]], n: int,
               sampling: SamplingParams) -> list[list[Completion]]:
    """Splits the prompts over the engines; a chunk whose engine dies is retried on its restart."""
    from ray.exceptions import RayActorError
    prompts = [list(p) for p in prompt_ids]
    if not prompts:
      raise ValueError("prompt_ids must be a non-empty list of token-id lists")
    engines = self._serving()
    k = len(engines)
    chunks = [c for c in (list(range(i, len(prompts), k)) for i in range(k)) if c]
    results: list[list[Completion] | None] = [None] * len(prompts)
    pending = {}
    for c, idx in enumerate(chunks):
      pending[c] = (idx, engines[c], self._submit(engines[c], [prompts[j] for j in idx], n, sampling))
    attempts = 0
    while pending:
      c, (idx, i, (actor, ref)) = next(iter(pending.items()))
      try:
        out = self._ray.get(ref)
      except RayActorError:
        attempts += 1
        if attempts > self.max_restarts:
          raise
        self._restart(i, actor)
        retry = self._pick(i)
        pending[c] = (idx, retry, self._submit(retry, [prompts[j] for j in idx], n, sampling))
        continue
      finally:
        self.in_flight[i] = max(0, self.in_flight[i] - len(idx))
      self.served[i] += len(idx)
      for j, group in zip(idx, out):
        results[j] = group
      del pending[c]
    return results

  def _submit(self, i, prompts, n, sampling):
    self.in_flight[i] += len(prompts)
    actor = self.actors[i]
    return actor, actor.generate.remote(prompts, n, sampling)

  async def agenerate(self, prompt_ids: Sequence[int], n: int, sampling: SamplingParams) -> list[Completion]:
    """One prompt's n completions from the least-loaded engine; retried on an engine restart."""
    prompt = list(prompt_ids)
    return (await self.on_an_engine(lambda i, actor: actor.generate.remote([prompt], n, sampling)))[0]

  async def on_an_engine(self, call: Callable[[int, Any], Any]) -> Any:
    """`await call(i, actor)` on the least-loaded engine `i` at the fleet's weight version, counted
    in its load. When the engine dies under the call (Ray's actor error, also as the cause of a
    task error: the call may go through another actor that calls the engine), the engine is
    restarted (with the fleet's newest weights) and the call made again, up to
    `rollout.max_restarts` times; any other failure is raised as it is."""
    from ray.exceptions import RayActorError, RayTaskError
    for attempt in range(self.max_restarts + 1):
      i = min(self._serving(), key=lambda j: self.in_flight[j])
      actor = self.actors[i]
      self.in_flight[i] += 1
      try:
        out = await call(i, actor)
      except (RayActorError, RayTaskError) as e:
        died = isinstance(e, RayActorError) or isinstance(getattr(e, "cause", None), RayActorError)
        if not died or attempt == self.max_restarts:
          raise
        await asyncio.to_thread(self._restart, i, actor)
        continue
      finally:
        self.in_flight[i] = max(0, self.in_flight[i] - 1)
      self.served[i] += 1
      return out
    raise AssertionError("unreachable")

  def prompt_logprobs(self, sequences: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """Scores on EVERY engine and returns the rows farthest from engine 0's, so the canary sees
    an engine that missed an update."""
    outs = self._ray.get([a.prompt_logprobs.remote([list(s) for s in sequences]) for a in self.actors])
    rows = []
    for j in range(len(sequences)):
      dev = [np.abs(o[j] - outs[0][j]).max() for o in outs]
      rows.append(outs[int(np.argmax(dev))][j])
    return rows

  def update_weights(self, named_tensors: Iterable[tuple[str, np.ndarray]], version: int) -> None:
    """One `ray.put` of the (name, array) pairs, read by every engine from the object store;
    kept for restarted engines. Ray writes a C- or Fortran-contiguous array into the store with
    one copy and an engine on this node maps it without one (the name map's transposed views of
    the JAX kernels are Fortran-contiguous); any other layout is made C-contiguous first."""
    named = []
    for name, tensor in named_tensors:
      a = np.asarray(tensor)
      named.append((name, a if a.flags.c_contiguous or a.flags.f_contiguous else np.ascontiguousarray(a)))
    ref = self._ray.put(named)
    del named
    self._loaded(self._ray.get([a.update_weights.remote(ref, version) for a in self.actors]), version)
    self._latest_weights, self._version = ref, int(version)

  def load_shared_memory(self, block_name: str, index, version: int) -> None:
    self._loaded(self._ray.get([a.load_shared_memory.remote(block_name, index, version)
                                for a in self.actors]), version)
    self._latest_weights, self._version = None, int(version)

  def load_lora_adapter(self, path: str, version: int) -> None:
    """The PEFT adapter directory `path` (this host) to every engine: its files travel through
    the object store (engines may be on other nodes) and each actor serves its own copy."""
    files = {}
    for name in sorted(os.listdir(path)):
      with open(os.path.join(path, name), "rb") as f:
        files[name] = f.read()
    ref = self._ray.put(files)
    self._loaded(self._ray.get([a.load_lora_adapter.remote(ref, version) for a in self.actors]), version)
    self._latest_adapter, self._version = ref, int(version)

  # -- the weight-broadcast group (the sender is `dockyard.refit.nccl`, rank 0) ----------------
  @property
  def broadcast_ranks(self) -> int:
    """How many worker ranks receive a broadcast: every engine's tensor-parallel workers."""
    return len(self.actors) * int(self.rollout["tensor_parallel_size"])

  @property
  def broadcast_group_current(self) -> bool:
    """False before the first join and after an engine restart (the new engine is not in it)."""
    return self._group_restarts == self.restarts

  def join_broadcast_group(self, host: str, port: int, backend: str) -> Callable[[], None]:
    """Starts every engine's workers joining the group as ranks 1..`broadcast_ranks`; returns the
    wait. The sender joins as rank 0 between the two: the rendezvous needs every rank at once."""
    tp = int(self.rollout["tensor_parallel_size"])
    world, restarts = 1 + self.broadcast_ranks, self.restarts
    refs = [a.nccl_init.remote(host, port, 1 + i * tp, world, backend) for i, a in enumerate(self.actors)]

    def wait() -> None:
      self._ray.get(refs)
      self._group_restarts = restarts
    return wait

  def receive_broadcast(self, meta, version: int) -> Callable[[], None]:
    """Starts every engine receiving the tensors `meta` lists [(name, torch dtype, shape)];
    returns the wait, after which `version` is current. A restarted engine cannot be given these
    weights: it is stale (serves nothing) until the next broadcast, which it joins."""
    refs = [a.nccl_receive.remote(meta, version) for a in self.actors]

    def wait() -> None:
      self._ray.get(refs)
      self._loaded([info["version"] for info in self.engine_info()], version)
      self._latest_weights, self._version = None, int(version)
    return wait

  def prepare_for_generation(self) -> None:
    self._ray.get([a.prepare_for_generation.remote() for a in self.actors])

  def shutdown(self) -> None:
    from ray.util.placement_group import remove_placement_group
    if not self._ray.is_initialized():
      return   # Ray is already down: its actors and placement groups went with it
    for a in self.actors:
      self._ray.kill(a)
    for pg in self.placement_groups:
      remove_placement_group(pg)
