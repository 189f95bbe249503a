"""The age-bounded buffer on its own: back-pressure, age bound, ordering, checkpoint state, close."""
import threading
import time

import pytest

from async_parts import async_config
from dockyard.envs.base import Reward
from dockyard.grpo.batch import Group
from dockyard.grpo.age_buffer import AgeBoundedBuffer, BufferClosed, capacity_in_groups, group_version
from dockyard.grpo.step import PromptSampler
from dockyard.rollout.base import Completion

TASKS = [{"instance_id": f"t{i}", "answer": i} for i in range(6)]


def group(task, version=0, token_versions=None):
  c = Completion(prompt_ids=[1], token_ids=[2, 3], logprobs=[-0.5, -0.25], finish_reason="stop",
                 weight_version=version, text="x", token_weight_versions=token_versions)
  return Group(task=task, prompt_ids=[1], completions=[c, c], texts=["x", "y"],
               rewards=[Reward(1.0, info={"obj": object()}), Reward(0.0, malformed=True)])


def test_reserve_blocks_when_full_and_resumes_after_take():
  buf = AgeBoundedBuffer(PromptSampler(TASKS, seed=1), capacity=3, max_age=1, per_step=2)
  got = [buf.reserve(timeout=0) for _ in range(3)]
  assert [s for s, _ in got] == [0, 1, 2]
  assert buf.reserve(timeout=0.05) is None            # pending counts against the capacity
  for seq, task in got:
    buf.put(seq, group(task), 0)
  assert buf.reserve(timeout=0.05) is None            # ready groups do too
  unblocked = []
  t = threading.Thread(target=lambda: unblocked.append(buf.reserve(timeout=5)))
  t.start()
  time.sleep(0.1)
  assert not unblocked                                # still waiting: the back-pressure
  assert [e.seq for e in buf.take(2)] == [0, 1]
  t.join(5)
  assert unblocked[0][0] == 3
  m = buf.metrics()
  assert m["buffer/ready"] == 1 and m["buffer/pending"] == 1 and m["buffer/taken"] == 2


def test_groups_older_than_the_age_bound_are_dropped_and_counted():
  buf = AgeBoundedBuffer(PromptSampler(TASKS), capacity=6, max_age=1, per_step=2, version=0)
  seqs = [buf.reserve()[0] for _ in range(4)]
  assert buf.put(seqs[0], group(TASKS[0]), 0)
  buf.set_version(1)
  assert buf.put(seqs[1], group(TASKS[1]), 0)         # age 1: still eligible
  buf.set_version(2)                                  # seq 0 and 1 are now 2 steps old
  assert not buf.put(seqs[2], group(TASKS[2]), 0)     # arrives already too old
  assert buf.put(seqs[3], group(TASKS[3]), 1)
  assert buf.metrics()["buffer/dropped/stale"] == 3
  assert [d["seq"] for d in buf.drain_dropped()] == [0, 1, 2] and buf.drain_dropped() == []
  assert [e.seq for e in buf.take(1)] == [3]
  with pytest.raises(TimeoutError, match="no 1 ready groups"):
    buf.take(1, timeout=0.05)


def test_the_collector_does_not_run_ahead_of_what_the_age_bound_can_train():
  buf = AgeBoundedBuffer(PromptSampler(TASKS * 3), capacity=10, max_age=1, per_step=2, version=0)
  got = [buf.reserve(timeout=0) for _ in range(5)]
  # version 0, age <= 1: only steps 1 and 2 (2 groups each) can still use a group started now
  assert [g[0] for g in got[:4]] == [0, 1, 2, 3] and got[4] is None
  for seq, task in got[:4]:
    buf.put(seq, group(task), 0)
  buf.take(2)
  assert buf.reserve(timeout=0) is None               # taken, but the weights have not moved yet
  buf.set_version(1)
  assert [buf.reserve(timeout=0)[0] for _ in range(2)] == [4, 5] and buf.reserve(timeout=0) is None
  buf.take(2)
  buf.skip(2)                                         # a step that trained nothing frees its share
  assert [buf.reserve(timeout=0)[0] for _ in range(2)] == [6, 7] and buf.reserve(timeout=0) is None
  assert buf.metrics()["buffer/dropped/stale"] == 0


def test_take_in_order_waits_for_the_lowest_outstanding_prompts():
  buf = AgeBoundedBuffer(PromptSampler(TASKS), capacity=4, max_age=5, per_step=2)
  seqs = [buf.reserve()[0] for _ in range(3)]
  buf.put(seqs[1], group(TASKS[1]), 0)
  buf.put(seqs[2], group(TASKS[2]), 0)
  assert [e.seq for e in buf.take(2)] == [1, 2]       # whatever is ready
  buf2 = AgeBoundedBuffer(PromptSampler(TASKS), capacity=4, max_age=5, per_step=2)
  seqs = [buf2.reserve()[0] for _ in range(3)]
  buf2.put(seqs[1], group(TASKS[1]), 0)
  buf2.put(seqs[2], group(TASKS[2]), 0)
  with pytest.raises(TimeoutError):
    buf2.take(2, timeout=0.05, in_order=True)         # seq 0 is still pending
  buf2.abandon(seqs[0], "timeout")                    # a dropped prompt no longer holds the line
  assert [e.seq for e in buf2.take(2, in_order=True)] == [1, 2]
  assert buf2.metrics()["buffer/dropped/timeout"] == 1
  with pytest.raises(ValueError, match="capacity 4"):
    buf2.take(5)


def test_state_round_trip_restores_ready_groups_and_redoes_pending_prompts():
  import json
  sampler = PromptSampler(TASKS, seed=3)
  buf = AgeBoundedBuffer(sampler, capacity=5, max_age=2, per_step=1, version=4)
  reserved = [buf.reserve() for _ in range(4)]
  buf.put(reserved[1][0], group(reserved[1][1], 3, token_versions=[3, 4]), 3)
  buf.put(reserved[3][0], group(reserved[3][1], 4), 4)
  state = json.loads(json.dumps(buf.state()))         # it must survive JSON
  fresh = AgeBoundedBuffer(PromptSampler(TASKS, seed=3), capacity=5, max_age=2, per_step=1)
  fresh.load(state)
  assert fresh.version == 4 and sorted(fresh.ready) == [1, 3] and sorted(fresh.pending) == [0, 2]
  restored = fresh.ready[1].group
  assert restored.completions[0].token_weight_versions == [3, 4]
  assert restored.completions[0].logprobs == [-0.5, -0.25]
  assert restored.rewards[1].malformed and restored.rewards[0].info["obj"].startswith("<object")
  # pending prompts come back first, with their original seqs and tasks, then the stream goes on
  again = [fresh.reserve(timeout=0) for _ in range(3)]
  assert [(s, t["instance_id"]) for s, t in again[:2]] == [(0, reserved[0][1]["instance_id"]),
                                                          (2, reserved[2][1]["instance_id"])]
  assert again[2][0] == 4 and again[2][1] == sampler.next(1)[0]


def test_close_wakes_a_waiting_trainer_with_the_collector_error():
  buf = AgeBoundedBuffer(PromptSampler(TASKS), capacity=2, max_age=1, per_step=1)
  threading.Timer(0.1, lambda: buf.close(RuntimeError("boom"))).start()
  with pytest.raises(BufferClosed, match="boom"):
    buf.take(1)
  with pytest.raises(BufferClosed):
    buf.reserve()


def test_group_version_is_the_oldest_token_and_capacity_is_checked():
  g = group(TASKS[0], version=5, token_versions=[5, 5, 6])
  g.completions[1] = Completion([1], [2], [-1.0], "stop", weight_version=7)
  assert group_version(g) == 5
  assert group_version(g, to_logical=lambda v: v * 10) == 50
  config = async_config()
  assert capacity_in_groups(config) == 2 * 4              # 0: two steps of 4 prompts
  config.grpo.async_grpo.buffer_size = 24          # 3 groups of 8 < 4 prompts per step
  with pytest.raises(ValueError, match="buffer_size=24"):
    capacity_in_groups(config)
  with pytest.raises(ValueError, match="capacity must be >= 1"):
    AgeBoundedBuffer(PromptSampler(TASKS), capacity=0, max_age=1, per_step=1)
