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
                   arrays (`pack_group`). The driver sends the task and the prompt's ids and gets
                   back an ObjectRef and the weight versions (what the age bound needs); the
                   arrays travel node to node by Ray's object manager into the trainer node's
                   shared-memory store, where the trainer maps them (`unpack_group`) when it
                   takes the group. The driver relays no completion, patch or verdict.

What stays on the driver: prompts are built there (the env's prompt needs the task's repository
files); validation and evaluation score through the driver's env as before (held-out numbers,
not training experience); agent episodes (sessions live on one executor per episode) and a
reward-model env (a model in each worker) are refused by validation with this key.

`bench/data_plane.py` measures the bytes through the driver's process (its read/write system
calls, /proc/self/io) per step for both paths, and the step time.
"""
from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any, Mapping, Sequence

import numpy as np

from dockyard.envs.base import Reward
from dockyard.rollout.base import Completion, SamplingParams
from dockyard.rollout.chat import decode

# -- the group's wire format ---------------------------------------------------------------------
def pack_group(prompt_ids: Sequence[int], completions: Sequence[Completion], texts: Sequence[str],
               rewards: Sequence[Reward]) -> dict[str, np.ndarray]:
  """One scored group as flat numpy arrays (Ray stores numpy buffers out of band, so the reader
  maps them from shared memory). Rewards' info keeps what JSON holds (as the async buffer's
  checkpoint does); everything variable-length rides in one UTF-8 JSON buffer."""
  lengths = np.array([len(c.token_ids) for c in completions], np.int64)
  per_token = [c.token_weight_versions or [c.weight_version] * len(c.token_ids) for c in completions]
  meta = dict(texts=list(texts), rewards=[
      dict(value=float(r.value), malformed=bool(r.malformed), components={k: float(v) for k, v in r.components.items()},
           info={k: v if isinstance(v, (int, float, str, bool, type(None))) else repr(v) for k, v in r.info.items()})
      for r in rewards], per_token_versions=[c.token_weight_versions is not None for c in completions],
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
  rewards = [Reward(value=r["value"], info=r["info"], components=r["components"], malformed=r["malformed"])
             for r in meta["rewards"]]
  return prompt, completions, list(meta["texts"]), rewards


def record_bytes(record: Mapping[str, np.ndarray]) -> int:
  return int(sum(v.nbytes for v in record.values()))


# -- the worker (a Ray actor beside each engine) -----------------------------------------------------
class ExperienceWorkerImpl:
  """Generates a group on its engine and scores it on its node; an async Ray actor, so many
  groups are in flight at once and the env's clients live on the actor's event loop."""

  def __init__(self, env_factory, model_path: str):
    import transformers
    self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_path)
    self.env_factory, self.env = env_factory, None
    self.groups = 0

  def info(self) -> dict:
    import ray
    return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(), "groups": self.groups}

  async def play(self, engine, task: Mapping[str, Any], prompt_ids: list[int], n: int,
                 sampling: SamplingParams) -> dict:
    """The group: `engine`'s n completions of the prompt, decoded, scored, `ray.put`; returns the
    ObjectRef (in a list, so Ray hands it over unresolved), the weight versions and timings."""
    import ray
    if self.env is None:   # built on the actor's event loop, where its clients then live
      self.env = self.env_factory(self.tokenizer)
    t0 = time.perf_counter()
    completions = (await engine.generate.remote([list(prompt_ids)], n, sampling))[0]
    t1 = time.perf_counter()
    texts = [decode(self.tokenizer, c) for c in completions]
    rewards = await asyncio.gather(*(self.env.score(task, t) for t in texts))
    t2 = time.perf_counter()
    record = pack_group(prompt_ids, completions, texts, rewards)
    self.groups += 1
    versions = sorted({int(v) for c in completions for v in (c.token_weight_versions or [c.weight_version])})
    return dict(ref=[ray.put(record)], versions=versions, n=len(completions), tokens=int(len(record["token_ids"])),
                bytes=record_bytes(record), generate_s=t1 - t0, score_s=t2 - t1)

  async def close(self) -> None:
    if self.env is not None:
      await self.env.close()
      self.env = None


class ObjectStorePlane:
  """The driver's side: one worker per engine of a `RolloutFleet`; `group` plays one prompt's
  group on the least-loaded engine and returns it unpacked, plus its timings. A dead engine is
  restarted by the fleet (its newest weights loaded) and the group played again on it."""

  def __init__(self, fleet, env_factory, model_path: str):
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    self.fleet, self._ray = fleet, fleet._ray
    cls = self._ray.remote(ExperienceWorkerImpl)
    env = {"PYTHONPATH": os.pathsep.join(p for p in (_repo_root(), os.environ.get("PYTHONPATH", "")) if p)}
    # 0 CPUs in the engine's placement group: the worker lands on the engine's (inference) node and
    # takes nothing from its bundle.
    self.workers = [cls.options(
        num_cpus=0, max_concurrency=1000, runtime_env={"env_vars": env},
        scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=0),
    ).remote(env_factory, model_path) for pg in fleet.placement_groups]
    self.infos = self._ray.get([w.info.remote() for w in self.workers])
    self.shared_bytes = 0     # bytes the trainer mapped from the object store
    self.groups = 0

  async def group(self, task: Mapping[str, Any], prompt_ids: Sequence[int], n: int,
                  sampling: SamplingParams) -> tuple[list[int], list[Completion], list[str], list[Reward], dict]:
    from ray.exceptions import RayActorError, RayTaskError
    fleet = self.fleet
    for attempt in range(fleet.max_restarts + 1):
      i = min(range(len(fleet.actors)), key=lambda j: fleet.in_flight[j])
      engine = fleet.actors[i]
      fleet.in_flight[i] += 1
      try:
        out = await self.workers[i].play.remote(engine, dict(task), list(prompt_ids), n, sampling)
      except (RayActorError, RayTaskError) as e:
        # the engine died under the worker's call (a worker's own failure is not retried)
        if not (isinstance(e, RayActorError) or isinstance(getattr(e, "cause", None), RayActorError)):
          raise
        if attempt == fleet.max_restarts:
          raise
        await asyncio.to_thread(fleet._restart, i, engine)
        continue
      finally:
        fleet.in_flight[i] = max(0, fleet.in_flight[i] - 1)
      fleet.served[i] += 1
      record = await out["ref"][0]
      self.shared_bytes += record_bytes(record)
      self.groups += 1
      prompt, completions, texts, rewards = unpack_group(record)
      return prompt, completions, texts, rewards, out
    raise AssertionError("unreachable")

  def close(self) -> None:
    try:
      self._ray.get([w.close.remote() for w in self.workers], timeout=30)
    except Exception:   # a worker that is gone has nothing to close
      pass
    for w in self.workers:
      self._ray.kill(w)


def _repo_root() -> str:
  import dockyard
  return os.path.dirname(os.path.dirname(os.path.abspath(dockyard.__file__)))
