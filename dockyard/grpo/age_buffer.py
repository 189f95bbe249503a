"""The age-bounded buffer of async GRPO: scored groups wait here between the collector and the trainer.

Nothing is replayed: each group trains once, or is dropped when it grows too old.

Every prompt the collector dispatches gets a sequence number (`seq`, its position in the prompt
stream) and is *pending* until its group comes back generated and scored; then it is *ready*.
The trainer `take`s ready groups. Each group carries the weight version that generated it (the
oldest version any of its tokens saw, counted in optimizer steps); once the trainer's version
is more than `max_age` steps past it, the group is dropped (`dropped/stale`).

Back-pressure: `reserve` blocks the collector while pending plus ready groups fill `capacity`,
and also while starting one more would make a group that cannot be trained before it is too old
(the staleness rule of AReaL: groups accepted so far < (version + max_age + 1) x per_step), so a
fast collector waits instead of generating groups that would only be dropped.

The buffer owns the prompt stream's bookkeeping (the sampler, the sequence counter, pending and
ready groups) behind one lock, so `state()` is a consistent picture of the async state for a
checkpoint: on `load`, ready groups come back as they were and pending prompts are handed out
again first, so a resumed run loses no prompt and trains on none twice.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Mapping

from dockyard.envs.base import Reward
from dockyard.grpo.batch import Group
from dockyard.rollout.base import Completion


@dataclasses.dataclass
class Entry:
  seq: int          # position in the prompt stream
  group: Group      # generated and scored (advantages are set at training time)
  version: int      # weight version (optimizer steps) that generated its oldest token


class BufferClosed(RuntimeError):
  """The buffer was closed (the run is ending, or the collector failed: see __cause__)."""


def group_version(group: Group, to_logical=lambda v: v) -> int:
  """The oldest weight version that produced any token of the group (per-token when recorded)."""
  versions = []
  for c in group.completions:
    versions.extend(c.token_weight_versions or [c.weight_version])
  return min(to_logical(int(v)) for v in versions)


def _group_to_json(g: Group) -> dict:
  return dict(task=dict(g.task), prompt_ids=list(g.prompt_ids), texts=list(g.texts),
              completions=[dataclasses.asdict(c) for c in g.completions],
              rewards=[r.to_json() for r in g.rewards])


def _group_from_json(d: Mapping[str, Any]) -> Group:
  return Group(task=dict(d["task"]), prompt_ids=list(d["prompt_ids"]), texts=list(d["texts"]),
               completions=[Completion(**c) for c in d["completions"]],
               rewards=[Reward(**r) for r in d["rewards"]])


class AgeBoundedBuffer:
  """Age-bounded, size-bounded store of scored groups; thread-safe (collector thread + trainer)."""

  def __init__(self, sampler, capacity: int, max_age: int, per_step: int, version: int = 0):
    if capacity < 1:
      raise ValueError(f"buffer capacity must be >= 1 group, got {capacity} "
                       "(grpo.async_grpo.buffer_size is in trajectories: at least one group)")
    if max_age < 0:
      raise ValueError(f"grpo.async_grpo.max_trajectory_age_steps must be >= 0, got {max_age}")
    if per_step < 1 or per_step > capacity:
      raise ValueError(f"groups per step must be in [1, capacity={capacity}], got {per_step}")
    self.sampler, self.capacity, self.max_age, self.per_step = sampler, int(capacity), int(max_age), int(per_step)
    self.version = int(version)
    self.next_seq = 0
    self.pending: dict[int, Mapping[str, Any]] = {}   # seq -> task, dispatched, not back yet
    self.ready: dict[int, Entry] = {}
    self.redo: list[int] = []                         # pending seqs to hand out again (resume)
    self.counts = {"dropped/stale": 0, "dropped/timeout": 0, "dropped/error": 0, "added": 0, "taken": 0,
                   "skipped": 0}
    self.dropped: list[dict] = []                     # since the last `drain_dropped`
    self._cv = threading.Condition()
    self._closed: BaseException | bool = False

  # -- collector side ---------------------------------------------------------------------------
  def reserve(self, timeout: float | None = None) -> tuple[int, Mapping[str, Any]] | None:
    """The next prompt to generate (seq, task), blocking while the buffer is full; None on timeout."""
    with self._cv:
      if not self._cv.wait_for(lambda: self._closed or self.redo or self._room(), timeout):
        return None
      self._check_open()
      if self.redo:
        seq = self.redo.pop(0)
        return seq, self.pending[seq]
      seq, self.next_seq = self.next_seq, self.next_seq + 1
      self.pending[seq] = self.sampler.next(1)[0]
      return seq, self.pending[seq]

  def put(self, seq: int, group: Group, version: int) -> bool:
    """A scored group is back; False (and counted) when it is already too old to train on."""
    with self._cv:
      if seq not in self.pending:
        raise KeyError(f"group seq {seq} was not reserved (or was already put / abandoned)")
      del self.pending[seq]
      if self.version - version > self.max_age:
        self._drop(seq, group.task, "stale", version)
      else:
        self.ready[seq] = Entry(seq, group, int(version))
        self.counts["added"] += 1
      self._cv.notify_all()
      return seq in self.ready

  def abandon(self, seq: int, reason: str) -> None:
    """Gives up on a pending prompt (a timeout or error); counted as `dropped/<reason>`."""
    with self._cv:
      task = self.pending.pop(seq)
      self._drop(seq, task, reason, None)
      self._cv.notify_all()

  # -- trainer side -----------------------------------------------------------------------------
  def set_version(self, version: int) -> None:
    """The trainer's weights advanced to `version`; evicts groups that fell out of the age bound."""
    with self._cv:
      self.version = int(version)
      self._evict()
      self._cv.notify_all()

  def take(self, k: int, timeout: float | None = None, in_order: bool = False) -> list[Entry]:
    """Removes and returns `k` ready groups, oldest seq first, waiting until there are `k`.

    in_order: only the `k` lowest outstanding seqs (pending or ready) count, so the groups
    trained at each step do not depend on which generation finished first (reproducible runs).
    """
    if k > self.capacity:
      raise ValueError(f"cannot take {k} groups from a buffer of capacity {self.capacity}: raise "
                       "grpo.async_grpo.buffer_size")

    def chosen():
      if in_order:
        outstanding = sorted([*self.pending, *self.ready])[:k]
        ok = len(outstanding) == k and all(s in self.ready for s in outstanding)
        return outstanding if ok else None
      return sorted(self.ready)[:k] if len(self.ready) >= k else None

    with self._cv:
      deadline = None if timeout is None else time.monotonic() + timeout
      while (seqs := chosen()) is None:
        self._check_open()
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
          raise TimeoutError(f"no {k} ready groups after {timeout:.0f} s (ready {len(self.ready)}, "
                             f"pending {len(self.pending)})")
        self._cv.wait(left)
      out = [self.ready.pop(s) for s in seqs]
      self.counts["taken"] += len(out)
      self._cv.notify_all()
      return out

  def skip(self, n: int) -> None:
    """`n` taken groups trained nothing (dynamic sampling dropped them all): the version did not
    advance, so they must not count against the staleness allowance."""
    with self._cv:
      self.counts["skipped"] += int(n)
      self._cv.notify_all()

  def metrics(self) -> dict[str, float]:
    with self._cv:
      return {"buffer/ready": float(len(self.ready)), "buffer/pending": float(len(self.pending)),
              **{f"buffer/{k}": float(v) for k, v in self.counts.items()}}

  def drain_dropped(self) -> list[dict]:
    """The drops recorded since the last call: {seq, instance_id, reason, version}."""
    with self._cv:
      out, self.dropped = self.dropped, []
      return out

  # -- lifecycle and checkpoints ----------------------------------------------------------------
  def close(self, error: BaseException | None = None) -> None:
    """Wakes every waiter; they raise BufferClosed (chained to `error` when the collector failed)."""
    with self._cv:
      self._closed = error or True
      self._cv.notify_all()

  def state(self) -> dict:
    """JSON-able: sampler position, seq counter, version, pending prompts, ready groups, counts."""
    with self._cv:
      return dict(sampler=self.sampler.state(), next_seq=self.next_seq, version=self.version,
                  pending=[[s, dict(t)] for s, t in sorted(self.pending.items())],
                  ready=[dict(seq=e.seq, version=e.version, group=_group_to_json(e.group))
                         for e in sorted(self.ready.values(), key=lambda e: e.seq)],
                  counts=dict(self.counts))

  def load(self, state: Mapping[str, Any]) -> None:
    """Restores `state()`; pending prompts are handed out again, lowest seq first."""
    with self._cv:
      self.sampler.load(state["sampler"])
      self.next_seq, self.version = int(state["next_seq"]), int(state["version"])
      self.pending = {int(s): t for s, t in state["pending"]}
      self.redo = sorted(self.pending)
      self.ready = {int(e["seq"]): Entry(int(e["seq"]), _group_from_json(e["group"]), int(e["version"]))
                    for e in state["ready"]}
      self.counts.update(state["counts"])
      self._evict()

  # -- internals (call with the lock held) ------------------------------------------------------
  def _check_open(self) -> None:
    if self._closed:
      err = self._closed if isinstance(self._closed, BaseException) else None
      raise BufferClosed("the buffer is closed" + (f": collector failed: {err!r}" if err else "")) from err

  def _room(self) -> bool:
    out = len(self.pending) + len(self.ready)
    accepted = self.counts["taken"] - self.counts["skipped"] + out
    return out < self.capacity and accepted < (self.version + self.max_age + 1) * self.per_step

  def _drop(self, seq: int, task: Mapping[str, Any], reason: str, version: int | None) -> None:
    self.counts[f"dropped/{reason}"] = self.counts.get(f"dropped/{reason}", 0) + 1
    self.dropped.append(dict(seq=seq, instance_id=task.get("instance_id"), reason=reason, version=version))

  def _evict(self) -> None:
    for seq in [s for s, e in self.ready.items() if self.version - e.version > self.max_age]:
      e = self.ready.pop(seq)
      self._drop(seq, e.group.task, "stale", e.version)


def capacity_in_groups(config) -> int:
  """`grpo.async_grpo.buffer_size` (trajectories; 0: 2 steps' worth) as whole groups."""
  grpo = config.grpo
  n = int(grpo.num_generations_per_prompt)
  size = int(grpo.async_grpo.buffer_size) or 2 * int(grpo.num_prompts_per_step) * n
  groups = size // n
  if groups < grpo.num_prompts_per_step:
    raise ValueError(f"config.grpo.async_grpo.buffer_size={size} trajectories holds {groups} groups "
                     f"of {n}, fewer than one step's {grpo.num_prompts_per_step} prompts")
  return groups
