"""The Ray fleet: requests spread over engines, a killed engine is restarted and its requests
retried, object-store refit reaches every engine, a sync during generation corrupts nothing."""
import asyncio
import copy
import os
import threading
import time

import numpy as np
import pytest
import ray
import torch

from dockyard.refit.synchronizer import create_weight_synchronizer
from dockyard.refit.transports import ObjectStoreTransport
from dockyard.rollout.base import SamplingParams
from tests.rollout.hf_policy import LOGPROB_TOL, batch_of

pytestmark = pytest.mark.slow
PROMPTS = [[5 + i, 6, 7, 8 + i] for i in range(8)]


def check_against(policy, completions):
  """Each completion's sampled logprobs equal the policy's forward on the same tokens."""
  seqs = [c.prompt_ids + c.token_ids for c in completions]
  lp = policy.logprobs(batch_of(seqs))
  for row, c in zip(lp, completions):
    p = len(c.prompt_ids)
    np.testing.assert_allclose(c.logprobs, row[p:p + len(c.token_ids)], atol=LOGPROB_TOL)


def test_requests_spread_over_engines(fleet):
  served = list(fleet.served)
  out = fleet.generate(PROMPTS, n=2, sampling=SamplingParams(max_tokens=4, seed=0))
  assert [len(g) for g in out] == [2] * len(PROMPTS)
  assert all(c.prompt_ids == p for p, g in zip(PROMPTS, out) for c in g)
  assert all(fleet.served[i] > served[i] for i in range(2))

  async def many():
    return await asyncio.gather(*[fleet.agenerate(p, 2, SamplingParams(max_tokens=4, seed=1)) for p in PROMPTS])
  served = list(fleet.served)
  batches = sum(i["batches"] for i in fleet.engine_info())
  groups = asyncio.run(many())
  assert [len(g) for g in groups] == [2] * len(PROMPTS)
  assert all(g[0].prompt_ids == p for p, g in zip(PROMPTS, groups))
  assert all(fleet.served[i] > served[i] for i in range(2))
  # 8 requests in flight at once are batched together inside the engines, not run one by one.
  assert sum(i["batches"] for i in fleet.engine_info()) - batches < len(PROMPTS)


def test_bad_request_fails_alone_with_a_clear_error(fleet):
  async def mixed():
    return await asyncio.gather(fleet.agenerate([1, 2, 3], 1, SamplingParams(max_tokens=2)),
                                fleet.agenerate([1, 99999], 1, SamplingParams(max_tokens=2)),
                                return_exceptions=True)
  good, bad = asyncio.run(mixed())
  assert len(good) == 1 and good[0].prompt_ids == [1, 2, 3]
  assert isinstance(bad, ValueError) and "outside [0, 1024)" in str(bad)


def test_object_store_sync_reaches_every_engine(fleet, policy, config):
  sync = create_weight_synchronizer(config, policy, fleet)
  assert isinstance(sync.transport, ObjectStoreTransport)
  start = sync.version
  policy.perturb(0.5, seed=11)
  metrics = sync.refit()
  assert sync.version == fleet.weight_version == start + 1
  assert metrics["refit/canary/max_abs_logprob_delta"] <= config.refit.canary.max_abs_logprob_delta
  out = fleet.generate(PROMPTS, n=1, sampling=SamplingParams(max_tokens=6, seed=2))
  flat = [c for g in out for c in g]
  assert {c.weight_version for c in flat} == {start + 1}
  check_against(policy, flat)


def test_killed_engine_is_restarted_and_requests_retried(fleet, policy, config):
  sync = create_weight_synchronizer(config, policy, fleet)
  policy.perturb(0.3, seed=12)
  sync.refit()
  restarts, pids = fleet.restarts, fleet.engine_pids()
  result = {}
  t = threading.Thread(target=lambda: result.setdefault(
      "out", fleet.generate(PROMPTS, n=4, sampling=SamplingParams(max_tokens=200, seed=3))))
  t.start()
  deadline = time.time() + 60
  while t.is_alive() and time.time() < deadline and fleet.engine_info()[0]["in_batch"] == 0:
    time.sleep(0.02)
  assert t.is_alive(), "generation ended before the engine could be killed mid-request"
  ray.kill(fleet.actors[0])  # engine 0 is inside its vLLM batch now
  t.join(timeout=240)
  assert "out" in result, "generate did not return after the engine was killed"
  assert fleet.restarts == restarts + 1
  new_pids = fleet.engine_pids()
  assert new_pids[0] != pids[0] and new_pids[1] == pids[1]
  flat = [c for g in result["out"] for c in g]
  assert len(flat) == 4 * len(PROMPTS)
  # The restarted engine got the fleet's latest weights, not the checkpoint's.
  assert {c.weight_version for c in flat} == {sync.version}
  check_against(policy, flat)


def test_sync_during_generation_does_not_corrupt_completed_requests(fleet, policy, config):
  sync = create_weight_synchronizer(config, policy, fleet)
  policy.perturb(0.3, seed=13)
  sync.refit()
  old_version, old_policy = sync.version, copy.deepcopy(policy)
  result = {}
  t = threading.Thread(target=lambda: result.setdefault(
      "out", fleet.generate(PROMPTS, n=4, sampling=SamplingParams(max_tokens=150, seed=4))))
  t.start()
  # Wait until every engine is inside its vLLM batch (not merely sent the request).
  while t.is_alive() and not all(i["in_batch"] > 0 for i in fleet.engine_info()):
    time.sleep(0.02)
  assert t.is_alive(), "generation ended before the sync could overlap it"
  policy.perturb(0.5, seed=14)  # "the trainer took a step" while the engines are sampling
  sync.refit()
  t.join(timeout=240)
  flat = [c for g in result["out"] for c in g]
  assert sync.version == old_version + 1
  # Requests in flight during the sync finish on the weights they started with, labelled so.
  assert {c.weight_version for c in flat} == {old_version}
  check_against(old_policy, flat)
  after = [c for g in fleet.generate(PROMPTS[:2], 2, SamplingParams(max_tokens=6, seed=5)) for c in g]
  assert {c.weight_version for c in after} == {old_version + 1}
  check_against(policy, after)


def test_collective_transport_over_gloo_with_jax_arrays(fleet, policy, config):
  """The NCCL transport's protocol (stateless group, metadata, streamed broadcast, DLPack) on
  CPU through its gloo stand-in; the trainer side hands over jax arrays, as the JAX policy will."""
  import jax.numpy as jnp
  from dockyard.refit.canary import RefitCanary
  from dockyard.refit.nccl import NcclTransport
  from dockyard.refit.synchronizer import WeightSynchronizer

  class JaxArrays:
    def named_weights(self):
      return ((n, jnp.asarray(a)) for n, a in policy.named_weights())

    def logprobs(self, batch):
      return policy.logprobs(batch)

  # On a GPU box DOCKYARD_REFIT_BACKEND=nccl runs the same check over NCCL (docs/hardware-validation.md).
  backend = os.environ.get("DOCKYARD_REFIT_BACKEND") or None
  transport = NcclTransport(fleet, backend=backend)
  assert transport.backend == (backend or ("nccl" if torch.cuda.is_available() else "gloo"))
  canary = RefitCanary.random(fleet.vocab_size, config.refit.canary.max_abs_logprob_delta)
  sync = WeightSynchronizer(JaxArrays(), fleet, transport, canary)
  for seed in (21, 22):  # the second sync reuses the group
    policy.perturb(0.5, seed=seed)
    metrics = sync.sync_weights()
    assert metrics["refit/canary/max_abs_logprob_delta"] <= canary.max_abs_logprob_delta
  assert fleet.weight_version == sync.version
  out = [c for g in fleet.generate(PROMPTS[:2], 2, SamplingParams(max_tokens=6, seed=6)) for c in g]
  assert {c.weight_version for c in out} == {sync.version}
  check_against(policy, out)


def test_shared_memory_sync_into_the_fleet(fleet, policy, config):
  from dockyard.refit.transports import SharedMemoryTransport
  run_config = config.copy_and_resolve_references()
  run_config.refit.transport = "shared_memory"
  sync = create_weight_synchronizer(run_config, policy, fleet)
  assert isinstance(sync.transport, SharedMemoryTransport)
  policy.perturb(0.5, seed=31)
  metrics = sync.sync_weights()
  assert metrics["refit/canary/max_abs_logprob_delta"] <= run_config.refit.canary.max_abs_logprob_delta
  assert {i["version"] for i in fleet.engine_info()} == {sync.version}


def test_engines_must_report_the_version_pushed():
  from dockyard.rollout.fleet import RolloutFleet
  f = object.__new__(RolloutFleet)   # `_loaded` alone: no Ray, no engines
  f.engine_versions, f.stale = [0, 0], {1}
  f._loaded([3, 3], 3)
  assert f.engine_versions == [3, 3] and f.stale == set()   # a sync brings restarted engines back
  with pytest.raises(RuntimeError, match=r"weight version 4 was pushed but the engines report \[4, 3\]"):
    f._loaded([4, 3], 4)
  assert f.engine_versions == [3, 3]


def test_a_restarted_engine_the_fleet_cannot_update_serves_nothing_until_the_next_sync(
    fleet, config, tiny_path, policy):
  """Shared memory hands the weights over once, so the fleet has nothing to give a restarted
  engine: it must not sample with the engine's checkpoint weights. The other engine serves; with
  none left, generating is an error; the next sync brings the restarted engines back."""
  from dockyard.rollout.fleet import RolloutFleet
  run_config = config.copy_and_resolve_references()
  run_config.refit.transport = "shared_memory"
  run_config.rollout.num_engines = 2
  own = RolloutFleet(run_config, tiny_path)   # its own engines: the session fleet stays whole
  sampling = SamplingParams(max_tokens=4, seed=7)
  try:
    sync = create_weight_synchronizer(run_config, policy, own)
    policy.perturb(0.5, seed=41)
    sync.sync_weights()
    assert own.engine_versions == [1, 1] and own.stale == set()
    ray.kill(own.actors[0])
    served = list(own.served)
    out = [c for g in own.generate(PROMPTS, 1, sampling) for c in g]
    assert own.restarts == 1 and own.stale == {0} and own.engine_versions == [0, 1]
    assert {c.weight_version for c in out} == {1} and len(out) == len(PROMPTS)
    assert own.served[0] == served[0] and own.served[1] == served[1] + len(PROMPTS)
    check_against(policy, out)

    ray.kill(own.actors[1])
    with pytest.raises(RuntimeError, match="no rollout engine holds the fleet's weight version 1"):
      own.generate(PROMPTS[:2], 1, sampling)
    assert own.stale == {0, 1}

    policy.perturb(0.5, seed=42)
    metrics = sync.sync_weights()   # reaches the restarted engines: both serve again
    assert metrics["refit/engine_version_min"] == 2.0 and metrics["refit/engine_restarts"] == 2.0
    assert own.stale == set() and own.engine_versions == [2, 2]
    served = list(own.served)
    out = [c for g in own.generate(PROMPTS, 1, sampling) for c in g]
    assert {c.weight_version for c in out} == {2} and all(own.served[i] > served[i] for i in range(2))
    check_against(policy, out)
  finally:
    own.shutdown()
