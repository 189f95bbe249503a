"""Context parallelism ('sequence' mesh axis) on 8 fake CPU devices equals the unsplit run, and
the tokens really split. The 8 devices come from tests/trainer_jax/conftest.py's XLA_FLAGS."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from dockyard.policy import TrainBatch
from dockyard.trainer_jax import context_parallel as cp
from dockyard.trainer_jax import train
from dockyard.trainer_jax import sharding as shd
from dockyard.trainer_jax.model import segment_attention, token_logprobs
from dockyard.trainer_jax.policy import JaxPolicy

pytestmark = pytest.mark.skipif(
    jax.device_count() < 8,
    reason=f"needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX starts); "
           f"JAX has {jax.device_count()}")

TOL = 1e-5
AXES = ("data", "fsdp", "sequence", "tensor")


def _batch(vocab, b=8, t=56, seed=0):
  """Right-padded rows of varied lengths (5 .. t), so the key lengths matter."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(1, vocab, (b, t)).astype(np.int32)
  attn, loss = np.ones_like(ids), np.zeros((b, t), np.float32)
  for i, n in enumerate(np.linspace(5, t, b).astype(int)):
    attn[i, n:] = 0
    ids[i, n:] = 0
    loss[i, 3:n] = 1
  return TrainBatch(ids, attn, loss)


def _config(shape, axes, packing=0):
  from configs import swe
  config = swe.get_config("tiny")
  config.mesh.axes, config.mesh.shape = axes, shape
  config.cluster.cpu_devices = int(np.prod(shape))
  config.optim.micro_batch_size = 4
  config.policy.packing_row_tokens = packing
  return config


def _loss(model, mb, loss_mask):
  """Mean token NLL of one stacked micro-batch (right-padded or packed), as the train step sees it."""
  if "segment_ids" in mb:
    lp = train.packed_logprobs(model, mb)
  else:
    lp = token_logprobs(model(mb["input_ids"], mb["attention_mask"]), mb["input_ids"])
  return -(lp * loss_mask).sum() / loss_mask.sum()


@nnx.jit
def _grads(model, mb, loss_mask):
  return nnx.grad(_loss)(model, mb, loss_mask)


def _run(path, shape, axes, packing=0):
  """The policy, its stacked batch, and (logprobs of the batch, per-parameter gradients of
  `_loss` on its first micro-batch)."""
  config = _config(shape, axes, packing)
  policy = JaxPolicy.from_hf(path, config, devices=jax.devices()[:int(np.prod(shape))])
  batch = _batch(policy.model.config.vocab_size)
  logprobs = policy.logprobs(batch)
  stacked, _ = policy._stack_packed(batch) if packing else policy._stack(batch)
  keys = train.PACKED_KEYS if packing else ("input_ids", "attention_mask")
  mb = {k: stacked[k][0] for k in keys}
  grads = _grads(policy.model, mb, stacked["loss_mask"][0])
  grads = {jax.tree_util.keystr(p): np.asarray(g) for p, g in jax.tree_util.tree_leaves_with_path(grads)}
  return policy, stacked, (logprobs, grads)


@pytest.fixture(scope="module")
def references(tiny_models):
  """Unsplit runs on one device: right-padded, and packed."""
  return {packing: _run(tiny_models["qwen2"], (1, 1, 1), ("data", "fsdp", "tensor"), packing)[2]
          for packing in (0, 64)}


def _same(got, want):
  np.testing.assert_allclose(got[0], want[0], atol=TOL, rtol=0)
  assert np.abs(want[0]).max() > 1.0   # real logprobs, not zeros
  assert got[1].keys() == want[1].keys() and len(want[1]) > 5
  for name, g in want[1].items():
    np.testing.assert_allclose(got[1][name], g, atol=TOL, rtol=0, err_msg=name)


@pytest.mark.parametrize("shape,packing", [
    ((2, 1, 4, 1), 0),    # data=2 x sequence=4
    ((2, 2, 2, 1), 0),    # data=2 x fsdp=2 x sequence=2
    ((2, 1, 4, 1), 64),   # packed rows (segment ids) split 4 ways
])
def test_sequence_axis_matches_unsplit(tiny_models, references, shape, packing):
  policy, stacked, got = _run(tiny_models["qwen2"], shape, AXES, packing)
  seq = shape[2]
  # The axis is not ignored: every attention layer runs the split form, the batch's tokens are
  # placed in blocks of T / seq per device, and the hidden states leave the layers still split.
  assert all(layer.attn.seq_parallel is not None for layer in policy.model.layers)
  ids = stacked["input_ids"]
  assert ids.sharding.spec[2] == "sequence"
  assert {s.data.shape[2] for s in ids.addressable_shards} == {ids.shape[2] // seq}
  x = ids[0]
  h = nnx.jit(lambda m, x: m.hidden_states(x))(policy.model, x)
  assert {s.data.shape[1] for s in h.addressable_shards} == {x.shape[1] // seq}, h.sharding
  _same(got, references[packing])


def test_attention_with_window_and_segments_matches_unsplit():
  """The split kernel alone (sliding window, GQA, heads over 'tensor'), values and gradients."""
  mesh = shd.make_mesh((2, 2, 2), ("data", "sequence", "tensor"), jax.devices()[:8])
  sp = cp.make(mesh, (("batch", "data"), ("heads", "tensor")))
  rng = np.random.default_rng(1)
  b, t, h, kh, d = 2, 32, 4, 2, 8
  q, k, v = (jnp.asarray(rng.normal(size=(b, t, n, d)), jnp.float32) for n in (h, kh, kh))
  lengths = jnp.asarray([11, 32], jnp.int32)
  seg = jnp.asarray(np.repeat([[1, 2, 3, 0], [1, 1, 2, 2]], 8, axis=1), jnp.int32)
  put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))
  qs, ks, vs = (put(a, P("data", "sequence")) for a in (q, k, v))
  for window in (0, 5):
    def split(q, k, v, packed):
      return cp.attention(sp, q, k, v, None if packed else lengths, seg if packed else None,
                          scale=None, sliding_window=window)

    def whole(q, k, v, packed):
      if packed:
        return segment_attention(q, k, v, seg, None, sliding_window=window)
      return jax.nn.dot_product_attention(q, k, v, is_causal=True, key_value_seq_lengths=lengths,
                                          local_window_size=(window - 1, 0) if window else None)
    for packed in (False, True):
      loss = lambda f: (lambda q, k, v: jnp.sum(f(q, k, v, packed) * jnp.arange(d) / d))
      got = jax.jit(jax.value_and_grad(loss(split), argnums=(0, 1, 2)))(qs, ks, vs)
      want = jax.value_and_grad(loss(whole), argnums=(0, 1, 2))(q, k, v)
      np.testing.assert_allclose(got[0], want[0], atol=1e-4, rtol=1e-6)
      for g, w in zip(got[1], want[1]):
        np.testing.assert_allclose(g, w, atol=TOL, rtol=1e-6)
  out = jax.jit(lambda q, k, v: cp.attention(sp, q, k, v, lengths, None, scale=None,
                                             sliding_window=0))(qs, ks, vs)
  assert {s.data.shape[1] for s in out.addressable_shards} == {t // 2}
