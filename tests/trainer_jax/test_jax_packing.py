"""Sequence packing in the JAX trainer: packed == unpacked (logprobs, loss, metrics, gradients),
in fp32 to 1e-5, for the GRPO loss and the SFT NLL; micro-batches of packed rows (dynamic
batching) sum to the whole batch; the packed step keeps one compile across batches."""
import jax
import numpy as np
import pytest

from dockyard import packing
from dockyard.grpo.loss_spec import LossConfig
from dockyard.policy import TrainBatch
from dockyard.trainer_jax import hf_io
from dockyard.trainer_jax import sharding as shd
from dockyard.trainer_jax.loss import make_pg_loss, nll_loss
from dockyard.trainer_jax.policy import JaxPolicy

# The GRPO loss with its per-sequence pieces on: sequence-level normalization, a KL term, the
# importance weight, clipping active (prev logprobs are perturbed).
PG = make_pg_loss(LossConfig(normalization="sequence", reference_policy_kl_penalty=0.1))


def _policy(path, config, packing_row_tokens=0, micro_batch_size=8, seq_bucket=64):
  # lr 1, eps 1, no clipping or decay: Adam's first update is g / (|g| + 1), so the parameters
  # after one step compare the gradients themselves (not just their signs).
  config.optim.update(micro_batch_size=micro_batch_size, warmup_steps=0, lr=1.0, eps=1.0,
                      weight_decay=0.0, max_grad_norm=1e9)
  config.policy.packing_row_tokens = packing_row_tokens
  config.policy.seq_bucket = seq_bucket
  mesh = shd.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  return JaxPolicy.from_hf(path, config, mesh=mesh)


def _batch(vocab, b=9, t=40, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, vocab, (b, t)).astype(np.int32)
  attn, loss = np.zeros_like(ids), np.zeros((b, t), np.float32)
  for i in range(b):
    n = int(rng.integers(8, t + 1))
    attn[i, :n] = 1
    ids[i, n:] = 0
    loss[i, 5:n] = 1
  return TrainBatch(ids, attn, loss, extras={"advantages": rng.standard_normal(b).astype(np.float32)})


def _with_pg_extras(batch, lp, seed=0):
  rng = np.random.default_rng(seed)
  noise = lambda: (0.2 * rng.standard_normal(lp.shape)).astype(np.float32) * batch.attention_mask
  return TrainBatch(batch.input_ids, batch.attention_mask, batch.loss_mask, extras=dict(
      batch.extras, prev_logprobs=lp + noise(), generation_logprobs=lp + noise(),
      reference_logprobs=lp + noise()))


def _params(policy):
  return {k: np.asarray(v) for k, v in hf_io.named_params(policy.model).items()}


def _assert_same_step(a, b, pa, pb):
  for key in a:
    if key != "lr":
      assert abs(a[key] - b[key]) <= 1e-5 * max(1.0, abs(a[key])), (key, a[key], b[key])
  for name in pa:
    np.testing.assert_allclose(pa[name], pb[name], atol=1e-5, rtol=0, err_msg=name)


def test_ffd_packs_whole_sequences_within_the_budget():
  lengths = [30, 12, 25, 8, 40, 3, 17]
  bins = packing.first_fit_decreasing(lengths, 48)
  assert sorted(i for row in bins for i in row) == list(range(len(lengths)))
  assert all(sum(lengths[i] for i in row) <= 48 for row in bins)
  assert bins[0] == [4, 3]   # longest first, then the first row with room
  assert len(bins) == 3      # 135 tokens in 48-token rows: 3 is the minimum
  with pytest.raises(ValueError, match="packing_row_tokens"):
    packing.first_fit_decreasing([49], 48)
  groups = packing.token_budget_groups(lengths, 64)
  assert all(len(g) * max(lengths[i] for i in g) <= 64 for g in groups)


@pytest.mark.parametrize("loss", ["grpo", "nll"])
def test_packed_equals_unpacked(tiny_models, config, loss):
  path = tiny_models["qwen2"]
  # Rows of 256 with sequences <= 48 (the bucket): the banded attention path (two 128-blocks a window).
  plain = _policy(path, config.copy_and_resolve_references(), seq_bucket=16)
  packed = _policy(path, config.copy_and_resolve_references(), packing_row_tokens=256,
                   micro_batch_size=2, seq_bucket=16)
  batch = _batch(plain.model.config.vocab_size, b=12)
  plan = packing.pack_micro_batches(batch, 256, 2)
  used = plan[0].segment_ids.max(axis=1)
  assert len(plan) == 1 and (used[used > 0] >= 2).all(), "every packed row holds 2+ sequences"

  lp_plain, lp_packed = plain.logprobs(batch), packed.logprobs(batch)
  np.testing.assert_allclose(lp_packed, lp_plain, atol=1e-5, rtol=0)
  assert (lp_packed[batch.attention_mask == 0] == 0).all() and (lp_packed[:, 0] == 0).all()

  if loss == "grpo":
    batch, fn = _with_pg_extras(batch, lp_plain), PG
  else:
    fn = nll_loss
  a, b = plain.train_step(batch, fn), packed.train_step(batch, fn)
  assert a["grad_norm"] > 0
  _assert_same_step(a, b, _params(plain), _params(packed))


def test_banded_segment_attention_equals_the_full_mask():
  from dockyard.trainer_jax.model import segment_attention
  rng = np.random.default_rng(0)
  b, l, h, kh, d = 2, 512, 4, 2, 16
  q, k, v = (jax.numpy.asarray(rng.standard_normal((b, l, n, d)), np.float32) for n in (h, kh, kh))
  seg = np.zeros((b, l), np.int32)
  for r in range(b):
    col, s = 0, 1
    while col < l - 40:
      n = min(int(rng.integers(20, 160)), l - col)
      seg[r, col:col + n], col, s = s, col + n, s + 1
  seg = jax.numpy.asarray(seg)

  def f(window, seg=seg):
    return jax.jit(lambda q: segment_attention(q, k, v, seg, window))
  full, banded = f(None), f(160)
  np.testing.assert_allclose(banded(q), full(q), atol=1e-5, rtol=0)
  grad = lambda fn: jax.grad(lambda q: (fn(q) * v.mean(axis=2, keepdims=True)).sum())(q)
  np.testing.assert_allclose(grad(banded), grad(full), atol=1e-5, rtol=0)
  # A segment longer than the window: the band leaves its early keys out and is no longer exact
  # (so the comparison above can fail).
  one = jax.numpy.ones((b, l), np.int32)
  assert float(jax.numpy.abs(f(160, one)(q) - f(None, one)(q)).max()) > 1e-3


def test_packed_micro_batches_sum_to_the_whole_batch_and_share_one_compile(tiny_models, config):
  """Dynamic batching: one packed row of 64 tokens a micro-batch (several micro-batches, each
  holding as many sequences as fit) gives the whole batch's step; batches of other sizes and
  lengths reuse the compiled step (fixed row length, power-of-two counts)."""
  compiles = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, secs, **kw: compiles.append(event) if event == "/jax/core/compile/backend_compile_duration" else None)
  path = tiny_models["qwen2"]
  # The plain policy's shapes are test_packed_equals_unpacked's: its compiled step is reused.
  plain = _policy(path, config.copy_and_resolve_references(), seq_bucket=16)
  micro = _policy(path, config.copy_and_resolve_references(), packing_row_tokens=64, micro_batch_size=1,
                  seq_bucket=16)
  batch = _batch(plain.model.config.vocab_size, b=12, seed=1)
  assert len(packing.pack_micro_batches(batch, 64, 1)) >= 3
  batch = _with_pg_extras(batch, plain.logprobs(batch), seed=1)
  a, b = plain.train_step(batch, PG), micro.train_step(batch, PG)
  _assert_same_step(a, b, _params(plain), _params(micro))

  def shape_key(b):   # what the compiled step's shapes depend on: micro-batch and sequence caps
    plan = packing.pack_micro_batches(b, 64, 1)
    return (1 << (len(plan) - 1).bit_length(), 1 << (max(len(m.seqs) for m in plan) - 1).bit_length())
  key, ran = shape_key(batch), 0
  for seed in range(2, 40):
    other = _batch(plain.model.config.vocab_size, b=8 + seed % 5, t=34 + seed % 7, seed=seed)
    if shape_key(other) != key:
      continue
    other = _with_pg_extras(other, micro.logprobs(other), seed=seed)
    before = len(compiles)
    micro.train_step(other, PG)
    assert len(compiles) == before, f"batch {other.input_ids.shape} recompiled the packed step"
    ran += 1
    if ran == 3:
      break
  assert ran == 3, "too few batches of other sizes fell in the same shape bucket"


def test_a_sequence_longer_than_a_row_names_the_key(tiny_models, config):
  policy = _policy(tiny_models["qwen2"], config, packing_row_tokens=16)
  with pytest.raises(ValueError, match="packing_row_tokens"):
    policy.logprobs(_batch(policy.model.config.vocab_size))


def test_packed_moe_logprobs_equal_unpacked(config):
  """Qwen3-MoE (dropless routing): packed rows score every sequence as its own row does. (The
  router's aux loss is a per-micro-batch mean, so it follows the grouping, packed or not.)"""
  from dockyard.models.tiny import make_tiny_model
  path = make_tiny_model({"family": "qwen3_moe"})
  plain = _policy(path, config.copy_and_resolve_references(), seq_bucket=16)
  packed = _policy(path, config.copy_and_resolve_references(), packing_row_tokens=128,
                   micro_batch_size=2, seq_bucket=16)
  batch = _batch(plain.model.config.vocab_size, b=6)
  np.testing.assert_allclose(packed.logprobs(batch), plain.logprobs(batch), atol=1e-5, rtol=0)
