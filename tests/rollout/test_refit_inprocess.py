"""Refit into the in-process engine: updated weights arrive, versions advance, the canary bites."""
import numpy as np
import pytest

from dockyard.refit.canary import RefitCanary, RefitCanaryError
from dockyard.refit.synchronizer import (WeightSynchronizer, create_weight_synchronizer,
                                         make_transport, pick_transport_name)
from dockyard.refit.transports import InProcessTransport, SharedMemoryTransport
from dockyard.rollout.base import SamplingParams
from tests.rollout.hf_policy import LOGPROB_TOL, batch_of, hf_greedy

pytestmark = pytest.mark.slow


def engine_matches(engine, policy, prompts=([5, 6, 7, 8, 9], [100, 200, 300])):
  out = engine.generate(list(prompts), n=1, sampling=SamplingParams(temperature=0.0, max_tokens=8))
  for prompt, (c,) in zip(prompts, out):
    assert c.weight_version == engine.weight_version
    assert c.token_ids == hf_greedy(policy, list(prompt), len(c.token_ids))
    hf = policy.logprobs(batch_of([list(prompt) + c.token_ids]))[0, len(prompt):]
    np.testing.assert_allclose(c.logprobs, hf, atol=LOGPROB_TOL)


def named_by(named, name):
  return next(a for n, a in named if n == name)


def swap_qk(named):
  """A deliberately wrong name map: layer 0's q_proj and k_proj rows trade places (k is smaller,
  so q's first rows land in k and k's rows in q's first rows: shapes stay legal)."""
  named = dict(named)
  q, k = named["model.layers.0.self_attn.q_proj.weight"], named["model.layers.0.self_attn.k_proj.weight"]
  q2 = q.copy()
  q2[:k.shape[0]] = k
  named["model.layers.0.self_attn.q_proj.weight"] = q2
  named["model.layers.0.self_attn.k_proj.weight"] = q[:k.shape[0]].copy()
  return list(named.items())


def drop_transpose(named):
  """A name map that forgot a transpose: o_proj is square here, so the shape still fits."""
  return [(n, a.T.copy() if n.endswith("layers.1.self_attn.o_proj.weight") else a) for n, a in named]


def test_sync_after_update_matches_trainer_and_versions_advance(engine, policy, config):
  sync = create_weight_synchronizer(config, policy, engine)
  assert isinstance(sync.transport, InProcessTransport)
  start = sync.version
  before = engine.prompt_logprobs([[5, 6, 7, 8, 9]])[0]
  policy.perturb(0.5, seed=1)
  metrics = sync.refit()
  assert sync.version == start + 1 == engine.weight_version
  assert metrics["refit/canary/max_abs_logprob_delta"] <= config.refit.canary.max_abs_logprob_delta
  assert metrics["refit/bytes"] > 0
  after = engine.prompt_logprobs([[5, 6, 7, 8, 9]])[0]
  assert np.abs(after - before).max() > 1e-2  # the weights really changed
  engine_matches(engine, policy)
  policy.perturb(0.5, seed=2)
  sync.refit()
  assert sync.version == start + 2 == engine.weight_version
  engine_matches(engine, policy)


def test_shared_memory_transport(engine, policy, config):
  config = config.copy_and_resolve_references()
  config.refit.transport = "shared_memory"
  sync = create_weight_synchronizer(config, policy, engine)
  assert isinstance(sync.transport, SharedMemoryTransport)
  policy.perturb(0.5, seed=3)
  metrics = sync.sync_weights()
  assert metrics["refit/canary/max_abs_logprob_delta"] <= config.refit.canary.max_abs_logprob_delta
  engine_matches(engine, policy)


class WrongMapPolicy:
  """Wraps a policy, corrupting its named_weights stream with `corrupt`."""

  def __init__(self, policy, corrupt):
    self.policy, self.corrupt = policy, corrupt

  def named_weights(self):
    return self.corrupt(list(self.policy.named_weights()))

  def logprobs(self, batch):
    return self.policy.logprobs(batch)


@pytest.mark.parametrize("corrupt", [swap_qk, drop_transpose], ids=["qk_swapped", "transpose_dropped"])
def test_canary_catches_wrong_mapping(engine, policy, config, corrupt):
  canary = RefitCanary.random(engine.vocab_size, config.refit.canary.max_abs_logprob_delta)
  bad = WeightSynchronizer(WrongMapPolicy(policy, corrupt), engine, InProcessTransport(engine), canary)
  with pytest.raises(RefitCanaryError, match=r"max \|Δ logprob\|"):
    bad.sync_weights()
  # The same weights through a correct map pass, and heal the engine for the next tests.
  good = WeightSynchronizer(policy, engine, InProcessTransport(engine), canary)
  metrics = good.sync_weights()
  assert metrics["refit/canary/max_abs_logprob_delta"] <= canary.max_abs_logprob_delta


def test_version_must_increase_and_bad_names_fail(engine, policy, config):
  with pytest.raises(ValueError, match="weight version must increase"):
    engine.update_weights(policy.named_weights(), engine.weight_version)
  with pytest.raises(ValueError, match="unknown transport 'carrier_pigeon'"):
    config2 = config.copy_and_resolve_references()
    config2.refit.transport = "carrier_pigeon"
    pick_transport_name(config2, engine)
  with pytest.raises(ValueError, match="needs engines in other processes"):
    make_transport("object_store", engine)
  with pytest.raises(ValueError, match="needs engines in other processes"):
    make_transport("nccl", engine)
  with pytest.raises(ValueError, match="must be > 0"):
    RefitCanary.random(10, 0.0)


def test_canary_catches_a_stale_tied_lm_head(engine, policy, config):
  """The real CPU-vLLM bug (STACK.md): after a reload the packed tied lm_head keeps the old
  embedding unless it is re-processed. Loading without that step must trip the canary."""
  from dockyard.rollout.wire import pack_weights
  canary = RefitCanary.random(engine.vocab_size, config.refit.canary.max_abs_logprob_delta)
  policy.perturb(0.5, seed=8)
  engine.collective_rpc("dockyard_load_weights", (pack_weights(policy.named_weights()), False))
  engine.set_version(engine.weight_version + 1)
  with pytest.raises(RefitCanaryError):
    canary.check(policy, engine)
  sync = WeightSynchronizer(policy, engine, InProcessTransport(engine), canary)
  assert sync.sync_weights()["refit/canary/max_abs_logprob_delta"] <= canary.max_abs_logprob_delta


def test_direct_load_takes_the_plain_model_and_refuses_a_partial_layer(engine, policy, config, tiny_path):
  """The tiny dense model loads through the worker's `DirectLoader` (no vLLM `reload_weights`),
  and a sync that sends only part of a stacked layer (q_proj without its k_proj / v_proj) fails
  instead of packing a half-loaded q/k/v into the engine."""
  sync = create_weight_synchronizer(config, policy, engine)
  policy.perturb(0.5, seed=11)
  sync.refit()
  assert {"worker/load", "worker/repack", "worker/heads"} <= set(engine.last_load_timings)
  assert "worker/reload_weights" not in engine.last_load_timings
  engine_matches(engine, policy)
  version = engine.weight_version
  q = [(n, a) for n, a in policy.named_weights() if n == "model.layers.0.self_attn.q_proj.weight"]
  with pytest.raises(ValueError, match="partial weight load"):
    engine.update_weights(q, version + 1)
  assert engine.weight_version == version
  engine_matches(engine, policy)   # the layer kept its packed weights
  # q, k and q again: enough elements to fill q/k/v, but v never came; the second q is refused
  # (counting elements alone would pack the stale v rows of a pooled buffer)
  qkv = {n.rsplit(".", 2)[-2]: (n, a) for n, a in policy.named_weights()
         if n.startswith("model.layers.0.self_attn.") and n.endswith("_proj.weight")}
  with pytest.raises(ValueError, match="arrived twice"):
    engine.update_weights([qkv["q_proj"], qkv["k_proj"], qkv["q_proj"]], version + 1)
  assert engine.weight_version == version
  engine_matches(engine, policy)
  # vLLM's reload path, turned back on for one sync, still loads the same weights
  assert engine.collective_rpc("dockyard_set_direct_load", (False,)) == [False]
  try:
    policy.perturb(0.5, seed=12)
    sync.refit()
    assert "worker/reload_weights" in engine.last_load_timings
    engine_matches(engine, policy)
  finally:
    assert engine.collective_rpc("dockyard_set_direct_load", (True,)) == [True]
  policy.perturb(0.5, seed=13)
  sync.refit()
  assert "worker/repack" in engine.last_load_timings
  engine_matches(engine, policy)
  # The JAX trainer's name map hands over strided views (its kernels transposed, no copy): the
  # staging weights take that layout (column-major), where C-ordered tensors like the ones above
  # got row-major ones; the canary checks the engine against the JAX policy after the sync.
  import jax

  from dockyard.trainer_jax.policy import JaxPolicy
  jax_policy = JaxPolicy.from_hf(tiny_path, config, devices=jax.devices()[:1])
  assert not named_by(jax_policy.named_weights(), "model.layers.0.mlp.down_proj.weight").flags.c_contiguous
  jax_sync = create_weight_synchronizer(config, jax_policy, engine)
  assert jax_sync.refit()["refit/canary/max_abs_logprob_delta"] <= config.refit.canary.max_abs_logprob_delta
  assert "worker/repack" in engine.last_load_timings
  policy.perturb(0.5, seed=15)
  create_weight_synchronizer(config, policy, engine).refit()   # back to C-ordered tensors, same pool
  engine_matches(engine, policy)
