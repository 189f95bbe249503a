"""The async GRPO loop's wiring, on the JAX bigram policy and its sampler (`tests/grpo/grpo_fakes.py`):
learning with bounded staleness, the importance-sampling correction against the generating policy,
timeouts that drop or retry, abort-and-resubmit, pausing generation for weight pushes, and a
collector failure that reaches the trainer."""
import asyncio
import json
import os
import threading

import numpy as np
import pytest

from async_parts import FirstDigitEnv, SlowGenerator, async_config
from dockyard import policy_factory, validate
from dockyard.envs.base import Reward
from dockyard.envs.math import MathConfig, MathEnv
from dockyard.rollout.base import BatchedAgenerate
from dockyard.grpo import async_source, loss_spec, step
from dockyard.grpo.batch import make_train_batch
from grpo_fakes import BigramPolicy, FakeSynchronizer, run_grpo


def parts(tokenizer, seed=0, lr=0.5, **gen_kw):
  policy = BigramPolicy(len(tokenizer), lr=lr, micro_batch_size=16, seed=seed)
  gen = SlowGenerator(np.asarray(policy.table), tokenizer.eos_token_id, **gen_kw)
  return policy, gen, FakeSynchronizer(policy, gen)


def run(config, tokenizer, workdir, env=None, **gen_kw):
  env = env or FirstDigitEnv(MathConfig.from_config(config))
  policy, gen, sync = parts(tokenizer, **gen_kw)
  res = run_grpo(config, policy=policy, generator=gen, synchronizer=sync, env=env, tokenizer=tokenizer,
                 train_tasks=env.train, val_tasks=env.validation, workdir=str(workdir), progress=False)
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  log = [json.loads(line) for line in open(os.path.join(workdir, async_source.ASYNC_LOG))]
  assert log[0] == {"start": 0, "next_seq": 0, "pending": []}
  log = [row for row in log if "step" in row]
  return res, [r for r in rows if "reward/raw_mean" in r], log, (policy, gen, sync)


def test_async_training_learns_with_bounded_staleness(tokenizer, tmp_path):
  config = async_config(**{"grpo.val_period": 6, "grpo.async_grpo.max_trajectory_age_steps": 1})
  res, steps, log, (policy, gen, sync) = run(config, tokenizer, tmp_path / "run")
  assert [r["step"] for r in steps] == list(range(1, 13)) and policy.step == 12
  first = np.mean([r["reward/raw_mean"] for r in steps[:3]])
  last = np.mean([r["reward/raw_mean"] for r in steps[-3:]])
  assert last > first + 0.25, (first, last)
  seqs = [s for row in log for s in row["seqs"]]
  assert len(seqs) == len(set(seqs)) == 12 * 4                  # no prompt trained twice
  ages = [row["step"] - 1 - v for row in log for v in row["versions"]]
  assert max(ages) <= 1 and min(ages) >= 0
  assert max(ages) == 1    # the collector ran ahead: some groups came from the previous weights
  stale = [r for r in steps if r["async/age_max"] >= 1]
  # groups from older weights: the trainer's prev logprobs differ from the sampler's
  assert max(r["train/is_logprob_abs_diff_mean"] for r in stale) > 1e-4
  for key in ("buffer/ready", "buffer/pending", "buffer/dropped/stale", "async/age_mean", "train/is_weight_mean",
              "train/is_ratio_mean", "time/wait", "time/train", "time/refit", "perf/tokens_per_s", "weight_version"):
    assert key in steps[-1], key
  # pending + ready never exceed the capacity (two steps of 4 prompts): the back-pressure
  assert max(r["buffer/ready"] + r["buffer/pending"] for r in steps) <= 8
  # ...and the staleness allowance kept a fast collector from generating groups only to drop them
  assert steps[-1]["buffer/dropped/stale"] == 0
  assert steps[-1]["buffer/added"] == 12 * 4 + steps[-1]["buffer/ready"]
  assert sync.calls == ["sync_weights", "prepare_for_generation"] * 12
  assert [v["step"] for v in res.val_history] == [6, 12]
  state = json.load(open(tmp_path / "run" / "checkpoints" / "latest" / "loop_state.json"))
  assert state["step"] == 12 and state["buffer"]["version"] == 12
  assert state["buffer"]["next_seq"] == 12 * 4 + len(state["buffer"]["pending"]) + len(state["buffer"]["ready"])


def test_importance_weights_are_against_the_generating_policy(tokenizer):
  config = async_config()
  env = MathEnv(MathConfig(num_train=4, num_validation=0))
  policy, gen, _ = parts(tokenizer, lr=0.5)
  sampling = step.SamplingParams(temperature=1.0, max_tokens=5, seed=3)
  old = step.collect_groups(gen, env, tokenizer, env.train[:2], 8, sampling)   # version 0 weights
  fresh = step.collect_groups(gen, env, tokenizer, env.train[2:], 8, sampling)
  for g in old + fresh:
    g.rewards = [Reward(float(i % 3 == 0)) for i in range(8)]
  step.assign_advantages(old + fresh, config)
  pg, _ = policy_factory.make_losses(config)
  step.train_on_groups(policy, fresh, pg, pad_id=tokenizer.pad_token_id)   # weights move on
  batch = make_train_batch(old, tokenizer.pad_token_id, step.PAD_MULTIPLE)
  prev = policy.logprobs(batch) * batch.loss_mask
  m = step.train_on_groups(policy, old, pg, pad_id=tokenizer.pad_token_id)
  # the sampler's logprobs of the old weights went into the batch; w = min(exp(prev - gen), cap)
  gen_lp = batch.extras["generation_logprobs"]
  np.testing.assert_allclose(gen_lp[batch.loss_mask > 0],
                             np.concatenate([c.logprobs for g in old for c in g.completions]), rtol=1e-6)
  w = np.minimum(np.exp((prev - gen_lp) * batch.loss_mask), 2.0)
  want = float((w * batch.loss_mask).sum() / batch.loss_mask.sum())
  assert m["train/is_weight_mean"] == pytest.approx(want, rel=1e-4)
  assert abs(want - 1.0) > 1e-3          # the correction is not a no-op on stale groups
  ref = loss_spec.clipped_pg_loss(prev, batch.loss_mask, {**batch.extras, "prev_logprobs": prev},
                                  loss_spec.LossConfig.from_config(config))[1]
  assert ref["is_weight_mean"] == pytest.approx(want, rel=1e-6)


def test_importance_sampling_correction_is_required(tokenizer, tmp_path):
  config = async_config()
  config.loss_fn.use_importance_sampling_correction = False
  with pytest.raises(validate.ConfigError, match="use_importance_sampling_correction"):
    validate.validate(config)
  with pytest.raises(ValueError, match="use_importance_sampling_correction"):
    run(config, tokenizer, tmp_path)


SMALL = {"grpo.num_prompts_per_step": 2, "grpo.num_generations_per_prompt": 4, "grpo.max_num_steps": 3,
         "checkpoint.enabled": False}


def test_a_hung_rollout_is_dropped_without_stalling_training(tokenizer, tmp_path):
  # consume_in_order: step 1 trains on seqs 0 and 1 (the hung call's prompt) unless seq 1 is
  # dropped, so the run cannot end before the timeout fires (on a fast machine it used to). The
  # hung call is held until the run has returned: training went on without it.
  config = async_config(**SMALL, **{"grpo.async_grpo.rollout_timeout_s": 0.3,
                                    "grpo.async_grpo.consume_in_order": True})
  release = threading.Event()
  try:
    _, steps, log, (_, gen, _) = run(config, tokenizer, tmp_path, hang_calls={1}, hang_s=60.0, release=release)
    assert 1 not in gen.returned and 0 in gen.returned   # the hung call was still out when training ended
  finally:
    release.set()
  assert steps[-1]["buffer/dropped/timeout"] == 1 and steps[-1]["async/timeouts_rollout"] == 1
  dropped = [d for row in log for d in row["dropped"]]
  assert [d["reason"] for d in dropped] == ["timeout"] and dropped[0]["seq"] not in \
      {s for row in log for s in row["seqs"]}


def test_a_hung_rollout_is_retried(tokenizer, tmp_path):
  config = async_config(**SMALL, **{"grpo.async_grpo.rollout_timeout_s": 0.3, "grpo.async_grpo.on_timeout": "retry",
                                    "grpo.async_grpo.consume_in_order": True})
  _, steps, log, _ = run(config, tokenizer, tmp_path, hang_calls={0}, hang_s=12.0)
  assert steps[-1]["async/timeouts_rollout"] == 1 and steps[-1]["buffer/dropped/timeout"] == 0
  assert [row["seqs"] for row in log] == [[0, 1], [2, 3], [4, 5]]   # seq 0 (hung once) trained in order


class HangingScoreEnv(FirstDigitEnv):
  """Its first scoring never returns (a hung sandbox)."""
  calls = 0

  async def score(self, task, completion):
    self.calls += 1   # per instance: each test's env hangs on its own first call
    if self.calls == 1:
      await asyncio.sleep(3600)
    return await super().score(task, completion)


def test_a_hung_scoring_is_dropped(tokenizer, tmp_path):
  config = async_config(**SMALL, **{"grpo.async_grpo.score_timeout_s": 0.3})
  env = HangingScoreEnv(MathConfig.from_config(config))
  # Each generate call takes 0.3 s, so the run outlasts the timeout on any machine: the hung group
  # (calls 0-3, version 0) times out at ~0.6 s, and step 3 needs a group from a call that can only
  # start after step 2's push (calls 4-5 end >= 0.6 s), ready >= 0.9 s. Without the delay a fast
  # machine finished all 3 steps before the 0.3 s timeout fired.
  _, steps, log, _ = run(config, tokenizer, tmp_path, env=env, delay=0.3)
  assert steps[-1]["async/timeouts_score"] == 1 and steps[-1]["buffer/dropped/timeout"] == 1
  assert len({s for row in log for s in row["seqs"]}) == 6


def test_abort_resubmits_groups_whose_weights_changed(tokenizer, tmp_path):
  config = async_config(**{**SMALL, "grpo.async_grpo.in_flight_policy": "abort"})
  # Calls 0-3 fill the staleness allowance at version 0; calls 4 and 5 start after step 1's push
  # and are made to last until step 2's push: their weights change under them.
  _, steps, log, (_, gen, _) = run(config, tokenizer, tmp_path, straddle_calls={4, 5})
  # At least those two: under load any other call can also return just after a push, and abort
  # rightly redoes it too (CI saw 3), so the count is a lower bound, not an exact figure.
  assert steps[-1]["async/resubmitted"] >= 2
  # every resubmission is a fresh engine call (calls still in flight at the end are extra)
  assert gen.calls >= steps[-1]["buffer/added"] + steps[-1]["async/resubmitted"]
  assert steps[-1]["buffer/added"] >= 3 * 2


def test_weights_wait_for_in_flight_generation_when_configured(tokenizer, tmp_path):
  config = async_config(**SMALL, **{"grpo.async_grpo.in_flight_weight_updates": False})
  _, steps, _, (_, gen, sync) = run(config, tokenizer, tmp_path, delay=0.1)
  assert len(steps) == 3 and sync.version == 3
  assert gen.loads_while_generating == 0       # the collector paused and drained before each push


def test_a_collector_failure_reaches_the_trainer(tokenizer, tmp_path):
  config = async_config(**SMALL)
  with pytest.raises(RuntimeError, match="collector failed.*exploded on purpose"):
    run(config, tokenizer, tmp_path, fail_on_call=2)


class BatchingGenerator(BatchedAgenerate, SlowGenerator):
  """An in-process engine's `generate_many`: one call serves every request queued meanwhile
  (`BatchedAgenerate`, the seam's batching `agenerate`, as `VLLMEngine` has it)."""

  def __init__(self, *a, **kw):
    super().__init__(*a, **kw)
    self.batch_sizes = []

  def generate_many(self, requests):
    self.batch_sizes.append(len(requests))
    return [self.generate(p, n, s) for p, n, s in requests]


def test_requests_to_an_in_process_engine_are_batched(tokenizer, tmp_path):
  config = async_config(**SMALL)
  env = FirstDigitEnv(MathConfig.from_config(config))
  policy = BigramPolicy(len(tokenizer), lr=0.5, micro_batch_size=16)
  gen = BatchingGenerator(np.asarray(policy.table), tokenizer.eos_token_id, delay=0.05)
  run_grpo(config, policy=policy, generator=gen, synchronizer=FakeSynchronizer(policy, gen), env=env,
           tokenizer=tokenizer, train_tasks=env.train, val_tasks=env.validation, workdir=str(tmp_path),
           progress=False)
  assert policy.step == 3 and sum(gen.batch_sizes) >= 6
  assert max(gen.batch_sizes) > 1      # groups in flight together went to the engine as one batch
