"""The experience data plane: groups generated and scored on the rollout side, handed to the
trainer through Ray's shared-memory object store instead of through the driver.

`rollout.data_plane` selects the path a single-shot group takes (both trajectory sources):

  None (default)   colocated: the driver asks an engine for the completions (they come back
                   in the reply), decodes them, sends each patch to the sandbox over HTTP and
                   reads the verdicts back: every byte of the experience passes through the
                   driver's process twice over (in and out).
  'object_store'   one `ExperienceWorker` actor beside each engine (in the engine's placement
                   group, so on its inference node) asks its engine for the group's
                   completions, decodes them, scores them with the environment (the SWE env:
                   the sandbox client, from that node), and `ray.put`s the group as numpy
                   arrays (`pack_group`). The driver sends the task's index and the sampling
                   settings and gets back an ObjectRef and the weight versions (what the age
                   bound needs); the arrays travel node to node by Ray's object manager into
                   the trainer node's shared-memory store, where the trainer maps them
                   (`unpack_group`) when it takes the group. The driver relays no prompt,
                   completion, patch or verdict.

The worker builds the run's env and training tasks from the same config (repositories on shared
storage, as for the sandbox nodes: docs/deployment.md) and the prompt itself. What stays on the
driver: validation and evaluation score through the driver's env as before (held-out numbers,
not training experience); agent episodes (sessions live on one executor per episode) and a
reward-model env (a model in each worker) are refused by validation with this key.

The loop logs `perf/driver_io_bytes` (the bytes on the driver's TCP sockets during a step);
`bench/data_plane.py` compares both paths on a simulated cluster.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import threading
import time
from typing import Any, Mapping, Sequence

import numpy as np

from dockyard.envs.base import Reward
from dockyard.rollout.base import Completion, SamplingParams
from dockyard.rollout.chat import decode, encode_prompt

log = logging.getLogger(__name__)


# -- the group's wire format ---------------------------------------------------------------------
def pack_group(prompt_ids: Sequence[int], completions: Sequence[Completion], texts: Sequence[str],
               rewards: Sequence[Reward]) -> dict[str, np.ndarray]:
  """One scored group as flat numpy arrays (Ray stores numpy buffers out of band, so the reader
  maps them from shared memory). Rewards as `Reward.to_json` writes them (as the async buffer's
  checkpoint does); everything variable-length rides in one UTF-8 JSON buffer."""
  lengths = np.array([len(c.token_ids) for c in completions], np.int64)
  per_token = [c.token_weight_versions or [c.weight_version] * len(c.token_ids) for c in completions]
  meta = dict(texts=list(texts), rewards=[r.to_json() for r in rewards], per_token_versions=[c.token_weight_versions is not None for c in completions],
      loss_masks=[c.loss_mask for c in completions], finish=[c.finish_reason for c in completions])
  cat = lambda xs, dt: np.concatenate([np.asarray(x, dt) for x in xs]) if len(xs) else np.zeros(0, dt)
  return dict(
      prompt_ids=np.asarray(prompt_ids, np.int32),
      offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
      token_ids=cat([c.token_ids for c in completions], np.int32),
      logprobs=cat([c.logprobs for c in completions], np.float32),
      token_versions=cat(per_token, np.int64),
      weight_version=np.array([c.weight_version for c in completions], np.int64),
      meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))


def unpack_group(record: Mapping[str, np.ndarray]) -> tuple[list[int], list[Completion], list[str], list[Reward]]:
  """`pack_group`'s inverse: (prompt_ids, completions, texts, rewards) as the loop's records
  (Python lists, so the async buffer's checkpoint stays JSON)."""
  meta = json.loads(bytes(record["meta"]).decode())
  prompt = record["prompt_ids"].tolist()
  off = record["offsets"]
  completions = []
  for i in range(len(off) - 1):
    a, b = int(off[i]), int(off[i + 1])
    completions.append(Completion(
        prompt_ids=prompt, token_ids=record["token_ids"][a:b].tolist(), logprobs=record["logprobs"][a:b].tolist(),
        finish_reason=meta["finish"][i], weight_version=int(record["weight_version"][i]),
        token_weight_versions=record["token_versions"][a:b].tolist() if meta["per_token_versions"][i] else None,
        loss_mask=meta["loss_masks"][i]))
  rewards = [Reward(**r) for r in meta["rewards"]]
  return prompt, completions, list(meta["texts"]), rewards


def record_bytes(record: Mapping[str, np.ndarray]) -> int:
  return int(sum(v.nbytes for v in record.values()))


def task_key(task: Mapping[str, Any]) -> str:
  """A task's identity across processes and a checkpoint's JSON round trip."""
  return json.dumps(json.loads(json.dumps(task, default=str)), sort_keys=True)


def tasks_fingerprint(tasks: Sequence[Mapping[str, Any]]) -> str:
  return hashlib.sha256("\n".join(task_key(t) for t in tasks).encode()).hexdigest()


# -- the worker (a Ray actor beside each engine) -----------------------------------------------------
class ExperienceWorkerImpl:
  """Builds a group's prompt, generates it on its engine and scores it on its node; an async Ray
  actor, so many groups are in flight at once and the env's clients live on the actor's event
  loop. It builds the run's env and training tasks itself (`env_factory(tokenizer) -> (env,
  tasks)`, the same config as the driver's) and refuses to play when its tasks are not the
  driver's (`fingerprint`), since the driver names a task by its index."""

  def __init__(self, env_factory, model_path: str, fingerprint: str, engine):
    import transformers
    self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_path)
    self.env_factory, self.fingerprint = env_factory, fingerprint
    self.env, self.tasks = None, None
    self.engine = engine   # handed over once (and again after a restart), not with every group
    self.groups = 0

  def set_engine(self, engine) -> None:
    self.engine = engine

  def info(self) -> dict:
    import ray
    return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(), "groups": self.groups}

  async def play(self, index: int, n: int, sampling: SamplingParams) -> dict:
    """Training task `index`'s group: its prompt, the engine's n completions, decoded, scored,
    `ray.put`; returns the ObjectRef (in a list, so Ray hands it over unresolved), the weight
    versions and timings."""
    import ray
    if self.env is None:   # built on the actor's event loop, where its clients then live
      env, tasks = self.env_factory(self.tokenizer)
      if tasks_fingerprint(tasks) != self.fingerprint:
        await env.close()
        raise RuntimeError("the experience worker's training tasks differ from the driver's (same config, "
                           "different data on this node?); it cannot play tasks by index")
      self.env, self.tasks = env, tasks
    task = self.tasks[index]
    prompt_ids = encode_prompt(self.tokenizer, self.env.prompt_messages(task))
    t0 = time.perf_counter()
    completions = (await self.engine.generate.remote([prompt_ids], n, sampling))[0]
    t1 = time.perf_counter()
    texts = [decode(self.tokenizer, c) for c in completions]
    rewards = await asyncio.gather(*(self.env.score(task, t) for t in texts))
    t2 = time.perf_counter()
    record = pack_group(prompt_ids, completions, texts, rewards)
    self.groups += 1
    versions = sorted({int(v) for c in completions for v in (c.token_weight_versions or [c.weight_version])})
    return dict(ref=[ray.put(record)], versions=versions, bytes=record_bytes(record),
                generate_s=t1 - t0, score_s=t2 - t1)

  async def close(self) -> None:
    if self.env is not None:
      await self.env.close()
      self.env = None


class ObjectStorePlane:
  """The driver's side: one worker per engine of a `RolloutFleet`; `group(task, n, sampling)`
  plays one training task's group on the least-loaded engine and returns it unpacked, plus its
  timings. The driver sends the task's index in `tasks` and the sampling settings only. A dead
  engine is restarted by the fleet (`RolloutFleet.on_an_engine`: its newest weights loaded) and
  the group played again; a dead worker is replaced beside its engine (the engine untouched) and
  the group played again, up to `rollout.max_restarts` times a worker on average, as for engines."""

  def __init__(self, fleet, env_factory, model_path: str, tasks: Sequence[Mapping[str, Any]]):
    import ray
    self.fleet = fleet
    self._index = {task_key(t): i for i, t in enumerate(tasks)}
    self._cls = ray.remote(ExperienceWorkerImpl)
    self._args = (env_factory, model_path, tasks_fingerprint(tasks))
    self.workers = [self._start_worker(i, actor) for i, actor in enumerate(fleet.actors)]
    self._engines = list(fleet.actors)   # the engine handle each worker holds
    self.infos = ray.get([w.info.remote() for w in self.workers])
    self.worker_restarts = 0
    self._restart_lock = threading.Lock()   # groups in flight on a dead worker replace it once
    self.shared_bytes = 0     # bytes of groups the trainer mapped from the object store
    self.groups = 0
    self._reported = (0, 0)

  def _start_worker(self, i: int, engine):
    """Worker `i`, in engine `i`'s placement group with 0 CPUs: it lands on the engine's
    (inference) node and takes nothing from its bundle."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    env = {"PYTHONPATH": os.pathsep.join(p for p in (_repo_root(), os.environ.get("PYTHONPATH", "")) if p)}
    return self._cls.options(
        num_cpus=0, max_concurrency=1000, runtime_env={"env_vars": env},
        scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=self.fleet.placement_groups[i], placement_group_bundle_index=0),
    ).remote(*self._args, engine)

  def _restart_worker(self, i: int, dead) -> None:
    """Replaces worker `i` if it is still `dead` (groups in flight on it restart it once: the
    calls come from threads, `asyncio.to_thread`)."""
    import ray
    with self._restart_lock:
      if self.workers[i] is not dead:
        return
      limit = self.fleet.max_restarts * len(self.workers)
      if self.worker_restarts >= limit:
        raise RuntimeError(f"experience worker {i} died and the plane already replaced {self.worker_restarts} "
                           f"workers (config.rollout.max_restarts={self.fleet.max_restarts} a worker)")
      self.worker_restarts += 1
      engine = self.fleet.actors[i]
      worker = self._start_worker(i, engine)
      ray.get(worker.info.remote())   # up (its constructor ran) before it takes groups
      self.workers[i], self._engines[i] = worker, engine
      log.warning("experience worker %d died; replaced it (restart %d)", i, self.worker_restarts)

  async def group(self, task: Mapping[str, Any], n: int, sampling: SamplingParams
                  ) -> tuple[list[int], list[Completion], list[str], list[Reward], dict]:
    from ray.exceptions import RayActorError, RayTaskError
    key = task_key(task)
    if key not in self._index:
      raise KeyError(f"task {task.get('instance_id', '?')!r} is not one of the run's training tasks; the "
                     "data plane plays training tasks only")

    async def play(i, engine):   # worker i beside engine i, told of a restarted engine first
      worker = self.workers[i]
      try:
        if self._engines[i] is not engine:
          await worker.set_engine.remote(engine)
          self._engines[i] = engine
        return await worker.play.remote(self._index[key], n, sampling)
      except RayActorError as e:
        # The worker itself died: not the engine's death (that reaches here as the cause of a
        # task error from the worker), so the fleet must not restart the engine for it.
        if isinstance(e, RayTaskError) or getattr(e, "actor_id", None) != worker._actor_id.hex():
          raise
        raise _WorkerDied(i, worker) from e

    for attempt in range(self.fleet.max_restarts + 1):
      try:
        out = await self.fleet.on_an_engine(play)   # a serving engine; restarted and replayed if it dies
        break
      except _WorkerDied as died:
        if attempt == self.fleet.max_restarts:
          raise RuntimeError(f"experience worker {died.index} died under a group {attempt + 1} times") from died
        await asyncio.to_thread(self._restart_worker, died.index, died.worker)
    record = await out["ref"][0]
    self.shared_bytes += out["bytes"]
    self.groups += 1
    prompt, completions, texts, rewards = unpack_group(record)
    return prompt, completions, texts, rewards, out

  def metrics(self) -> dict[str, float]:
    """`data_plane/*` since the last call: groups read from the object store and their bytes."""
    groups, shared = self.groups - self._reported[0], self.shared_bytes - self._reported[1]
    self._reported = (self.groups, self.shared_bytes)
    return {"data_plane/groups": float(groups), "data_plane/shared_bytes": float(shared)}

  def close(self) -> None:
    import ray
    try:
      ray.get([w.close.remote() for w in self.workers], timeout=30)
    except Exception:   # a worker that is gone has nothing to close
      pass
    for w in self.workers:
      ray.kill(w)


class _WorkerDied(Exception):
  """Experience worker `index` (the handle `worker`) died under a call."""

  def __init__(self, index: int, worker):
    super().__init__(f"experience worker {index} died")
    self.index, self.worker = index, worker


def _repo_root() -> str:
  import dockyard
  return os.path.dirname(os.path.dirname(os.path.abspath(dockyard.__file__)))
