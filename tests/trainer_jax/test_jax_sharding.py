"""Sharded train steps on 8 fake CPU devices agree with one device, and parameters really split."""
import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from dockyard.policy import TrainBatch
from dockyard.trainer_jax import hf_io
from dockyard.trainer_jax import sharding as shd
from dockyard.trainer_jax.loss import nll_loss
from dockyard.trainer_jax.policy import JaxPolicy

# The one skip that stays: it depends on the hardware, not on an import. tests/conftest.py gives a
# CPU-only machine (CI) 8 fake host devices, so there it always runs; on an accelerator the default
# backend is the real chips, and a machine with fewer than 8 of them cannot hold the mesh.
pytestmark = pytest.mark.skipif(
    jax.device_count() < 8,
    reason=f"needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX starts); "
           f"JAX has {jax.device_count()}")

TOL = 1e-5


def _batch(vocab, b=16, t=48, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, vocab, (b, t)).astype(np.int32)
  attn = np.ones_like(ids)
  loss = np.zeros_like(ids)
  for i in range(b):
    n = int(rng.integers(t // 2, t + 1))
    attn[i, n:] = 0
    ids[i, n:] = 0
    loss[i, 8:n] = 1  # the first 8 tokens are the "prompt"
  return TrainBatch(ids, attn, loss)


def _spec(x):
  """A sharding spec padded to the array's rank (jit drops trailing Nones)."""
  spec = tuple(x.sharding.spec)
  return P(*(spec + (None,) * (x.ndim - len(spec))))


def _run(path, config, shape):
  config.mesh.shape = shape
  config.cluster.cpu_devices = 8
  policy = JaxPolicy.from_hf(path, config)
  batch = _batch(policy.model.config.vocab_size)
  metrics = [policy.train_step(batch, nll_loss) for _ in range(2)]
  params = {k: np.asarray(jax.device_get(v)) for k, v in hf_io.named_params(policy.model).items()}
  return policy, metrics, params


@pytest.fixture(scope="module")
def reference(tiny_models):
  from dockyard.validate import load_config_file
  import os
  here = os.path.dirname(os.path.abspath(__file__))
  config = load_config_file(os.path.join(here, "..", "..", "configs", "swe.py"))
  config.optim.micro_batch_size = 8
  config.optim.warmup_steps = 0  # so that both steps move the weights
  mesh = shd.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  policy = JaxPolicy.from_hf(tiny_models["qwen2"], config, mesh=mesh)
  batch = _batch(policy.model.config.vocab_size)
  metrics = [policy.train_step(batch, nll_loss) for _ in range(2)]
  params = {k: np.asarray(jax.device_get(v)) for k, v in hf_io.named_params(policy.model).items()}
  return config, metrics, params


@pytest.mark.parametrize("shape,expect", [
    ((8, 1, 1), {"layers.0.mlp.gate_proj.kernel": P(None, None)}),
    ((1, 8, 1), {"layers.0.mlp.gate_proj.kernel": P("fsdp", None),
                 "layers.0.attn.q_proj.kernel": P("fsdp", None, None),
                 "embed.embedding": P(None, "fsdp")}),
    ((2, 2, 2), {"layers.0.mlp.gate_proj.kernel": P("fsdp", "tensor"),
                 "layers.0.mlp.down_proj.kernel": P("tensor", "fsdp"),
                 "layers.0.attn.q_proj.kernel": P("fsdp", "tensor", None),
                 "layers.0.attn.o_proj.kernel": P("tensor", None, "fsdp"),
                 "embed.embedding": P("tensor", "fsdp")}),
])
def test_sharded_step_matches_single_device(tiny_models, reference, shape, expect):
  config, ref_metrics, ref_params = reference
  policy, metrics, params = _run(tiny_models["qwen2"], config.copy_and_resolve_references(), shape)
  assert dict(policy.mesh.shape) == dict(zip(("data", "fsdp", "tensor"), shape))
  live = hf_io.named_params(policy.model)
  for name, spec in expect.items():
    assert _spec(live[name]) == spec, (name, live[name].sharding.spec)
    if any(spec):
      # Really split: each device holds a fraction of the tensor.
      shard = live[name].addressable_shards[0].data
      assert shard.size < live[name].size, name
  # Adam moments follow their parameters' shardings.
  mu = policy.optimizer.opt_state.inner_state[1][0].mu
  assert _spec(mu["layers"][0]["mlp"]["gate_proj"]["kernel"][...]) == expect["layers.0.mlp.gate_proj.kernel"]
  for got, want in zip(metrics, ref_metrics):
    assert abs(got["loss"] - want["loss"]) <= TOL, (got, want)
    assert abs(got["grad_norm"] - want["grad_norm"]) <= TOL * max(1.0, want["grad_norm"])
  for name, want in ref_params.items():
    np.testing.assert_allclose(params[name], want, atol=TOL, rtol=0, err_msg=name)
  assert ref_metrics[1]["loss"] != ref_metrics[0]["loss"]  # the step did train


def test_micro_batch_not_divisible_by_batch_axes_is_an_error(tiny_models, config):
  config.mesh.shape = (8, 1, 1)
  config.cluster.cpu_devices = 8
  config.optim.micro_batch_size = 4
  with pytest.raises(ValueError, match="cpu_devices=9"):
    config.cluster.cpu_devices = 9
    JaxPolicy.from_hf(tiny_models["qwen2"], config)
  config.cluster.cpu_devices = 8
  with pytest.raises(ValueError, match="micro_batch_size=4"):
    JaxPolicy.from_hf(tiny_models["qwen2"], config)
