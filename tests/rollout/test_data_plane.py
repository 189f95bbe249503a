"""The experience data plane (`rollout.data_plane='object_store'`, dockyard/grpo/data_plane.py).

Unit: a group survives the object-store wire format field for field; task identity survives a
checkpoint's JSON round trip; validation refuses what the plane cannot carry. On the session's
two-engine Ray fleet (slow): a group played by an experience worker is the group the colocated
path gets for the same request (same tokens and logprobs from the same engine, rewards of the
same texts), a killed engine under a worker is restarted and the group played again, a killed
worker is replaced without touching its engine, and a worker whose training tasks are not the
driver's refuses to play.
"""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from dockyard import validate
from dockyard.envs.base import Reward
from dockyard.grpo import data_plane
from dockyard.rollout.base import Completion, SamplingParams
from dockyard.rollout.chat import decode, encode_prompt
from tests.rollout.plane_env import TASKS, TextEnv, other_tasks_env, text_env

def test_a_group_survives_the_wire_format():
  cs = [Completion([1, 2], [5, 6, 7], [-0.25, -0.5, -1.0], "stop", 3),
        Completion([1, 2], [8, 9], [-2.0, -0.125], "length", 3, token_weight_versions=[3, 4], loss_mask=[1, 0])]
  rewards = [Reward(1.0, info={"reason": "ok", "obj": object()}), Reward(0.0, components={"a": 0.5}, malformed=True)]
  record = data_plane.pack_group([1, 2], cs, ["a", "b"], rewards)
  assert all(isinstance(v, np.ndarray) for v in record.values())   # out-of-band buffers for Ray
  prompt, back, texts, got = data_plane.unpack_group(record)
  assert prompt == [1, 2] and texts == ["a", "b"]
  assert back == cs
  assert [(r.value, r.malformed, r.components) for r in got] == [(1.0, False, {}), (0.0, True, {"a": 0.5})]
  assert got[0].info["reason"] == "ok" and got[0].info["obj"].startswith("<object")
  assert data_plane.record_bytes(record) == sum(v.nbytes for v in record.values())


def test_task_identity_survives_a_json_round_trip():
  back = json.loads(json.dumps(TASKS))                     # tuples become lists, as in loop_state.json
  assert [data_plane.task_key(t) for t in back] == [data_plane.task_key(t) for t in TASKS]
  assert data_plane.tasks_fingerprint(back) == data_plane.tasks_fingerprint(TASKS)
  assert data_plane.tasks_fingerprint(TASKS[:2]) != data_plane.tasks_fingerprint(TASKS)


@pytest.mark.parametrize("edit,message", [
    (lambda c: setattr(c.rollout, "data_plane", "nccl"), "must be None"),
    (lambda c: c.env.reward_model.update(path="/some/rm"), "env.reward_model.path"),
])
def test_validation_refuses_what_the_plane_cannot_carry(edit, message):
  config = validate.load_config_file("configs/math.py:tiny")
  config.rollout.data_plane = "object_store"
  validate.validate(config)
  edit(config)
  with pytest.raises(validate.ConfigError, match=message) as e:
    validate.validate(config)
  assert e.value.key == "rollout.data_plane"


def test_validation_refuses_agent_episodes_on_the_plane():
  config = validate.load_config_file("configs/terminal.py:tiny")
  config.rollout.data_plane = "object_store"
  with pytest.raises(validate.ConfigError, match="agent episodes") as e:
    validate.validate(config)
  assert e.value.key == "rollout.data_plane"


# -- on the session's Ray fleet ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def plane(fleet, tiny_path):
  p = data_plane.ObjectStorePlane(fleet, text_env, tiny_path, TASKS)
  yield p
  p.close()


@pytest.mark.slow
def test_a_worker_plays_the_colocated_group(plane, fleet, tiny_path):
  import transformers
  tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_path)
  env, task = TextEnv(), TASKS[2]
  sampling = SamplingParams(temperature=1.0, max_tokens=12, seed=123)
  prompt, completions, texts, rewards, out = asyncio.run(plane.group(json.loads(json.dumps(task)), 3, sampling))
  want_prompt = encode_prompt(tokenizer, env.prompt_messages(task))
  want = fleet.generate([want_prompt], 3, sampling)[0]          # the colocated path's request
  assert prompt == want_prompt
  assert [c.token_ids for c in completions] == [c.token_ids for c in want]
  for got, ref in zip(completions, want):
    np.testing.assert_allclose(got.logprobs, ref.logprobs, rtol=0, atol=1e-6)   # float32 on the wire
    assert (got.finish_reason, got.weight_version) == (ref.finish_reason, ref.weight_version)
  assert texts == [decode(tokenizer, c) for c in want]
  again = [asyncio.run(env.score(task, t)) for t in texts]
  assert [(r.value, r.malformed, r.info) for r in rewards] == [(r.value, r.malformed, r.info) for r in again]
  assert out["versions"] == [fleet.weight_version] and out["bytes"] > 0
  assert plane.metrics() == {"data_plane/groups": 1.0, "data_plane/shared_bytes": float(out["bytes"])}
  assert plane.metrics()["data_plane/groups"] == 0.0        # counted once


@pytest.mark.slow
def test_a_killed_engine_under_a_worker_is_restarted_and_the_group_played_again(plane, fleet):
  import ray
  restarts, pids = fleet.restarts, fleet.engine_pids()
  ray.kill(fleet.actors[0])     # idle engines: the next group goes to engine 0, through worker 0
  prompt, completions, texts, rewards, out = asyncio.run(
      plane.group(TASKS[0], 2, SamplingParams(max_tokens=6, seed=5)))
  assert len(completions) == 2 and len(rewards) == 2
  assert fleet.restarts == restarts + 1
  new = fleet.engine_pids()
  assert new[0] != pids[0] and new[1] == pids[1]
  assert out["versions"] == [fleet.weight_version]     # the restarted engine holds the fleet's weights


@pytest.mark.slow
def test_a_killed_worker_is_replaced_and_its_engine_left_alone(plane, fleet):
  import ray
  restarts, pids = fleet.restarts, fleet.engine_pids()
  # the engine the next group goes to (idle engines: the first serving one; an earlier test may
  # have left engine 0 stale, restarted under a transport that keeps no weights), and its worker
  i = min(fleet._serving(), key=lambda j: fleet.in_flight[j])
  dead = plane.workers[i]
  ray.kill(dead)
  prompt, completions, texts, rewards, out = asyncio.run(
      plane.group(TASKS[1], 2, SamplingParams(max_tokens=6, seed=7)))
  assert len(completions) == 2 and len(rewards) == 2
  assert plane.worker_restarts == 1 and plane.workers[i] is not dead
  assert fleet.restarts == restarts and fleet.engine_pids() == pids     # no engine was restarted
  assert out["versions"] == [fleet.weight_version]


@pytest.mark.slow
def test_a_worker_with_other_tasks_refuses_to_play(fleet, tiny_path):
  p = data_plane.ObjectStorePlane(fleet, other_tasks_env, tiny_path, TASKS)
  try:
    with pytest.raises(Exception, match="training tasks differ from the driver's"):
      asyncio.run(p.group(TASKS[1], 2, SamplingParams(max_tokens=4, seed=1)))
    with pytest.raises(KeyError, match="not one of the run's training tasks"):
      asyncio.run(p.group(dict(instance_id="nope"), 2, SamplingParams(max_tokens=4)))
  finally:
    p.close()
