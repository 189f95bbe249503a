"""Token-budget micro-batches (`optim.micro_batch_tokens`, dynamic batching) on the JAX trainer:
the step over micro-batches of whole sequences, each padded to its own length, equals the fixed
micro-batch step (loss, every metric, grad norm, updated parameters; fp32, 1e-5) for the GRPO
loss and the SFT NLL, with LoRA, with a Qwen3-MoE model (router losses, load, balancing bias) and
under the top-k contract; its loss is the whole batch's loss in one piece; a second step of the
same shapes compiles nothing."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dockyard.grpo.loss_spec import LossConfig
from dockyard.policy import TrainBatch
from dockyard.trainer_jax import hf_io
from dockyard.trainer_jax import sharding as shd
from dockyard.trainer_jax.loss import make_pg_loss, nll_loss
from dockyard.trainer_jax.policy import JaxPolicy
from tests.trainer_jax.test_jax_packing import _with_pg_extras

PG = make_pg_loss(LossConfig(normalization="sequence", reference_policy_kl_penalty=0.1))


def topk_loss(logprobs, loss_mask, extras):
  """Uses the top-k contract: the policy's logprobs of extras['topk_ids'] (with gradient)."""
  topk = (extras["topk_logprobs"].sum(-1) * loss_mask).sum() / extras["total_tokens"]
  return topk + 0.5 * (logprobs * loss_mask).sum() / extras["total_tokens"], {"topk": topk}


def _policy(path, config, micro_batch_tokens=0, micro_batch_size=4, seq_bucket=16, moe=None,
            lora=False, mesh_shape=(1, 1, 1)):
  # lr 1, eps 1, no clipping or decay: Adam's first update is g / (|g| + 1), so the parameters
  # after one step compare the gradients themselves (not just their signs).
  config = config.copy_and_resolve_references()
  config.optim.update(micro_batch_size=micro_batch_size, micro_batch_tokens=micro_batch_tokens,
                      warmup_steps=0, lr=1.0, eps=1.0, weight_decay=0.0, max_grad_norm=1e9)
  config.policy.seq_bucket = seq_bucket
  if moe is not None:
    config.policy.moe = moe
  if lora:
    config.policy.lora.update(enabled=True, rank=4, alpha=8.0)
  n = int(np.prod(mesh_shape))
  return JaxPolicy.from_hf(path, config, mesh=shd.make_mesh(mesh_shape, devices=jax.devices()[:n]))


def _batch(vocab, lengths, t=None, seed=0):
  """Right-padded rows of the given lengths; loss on tokens 3.. of each."""
  rng = np.random.default_rng(seed)
  b, t = len(lengths), t or max(lengths)
  ids = rng.integers(3, vocab, (b, t)).astype(np.int32)
  attn, loss = np.zeros_like(ids), np.zeros((b, t), np.float32)
  for i, n in enumerate(lengths):
    attn[i, :n], ids[i, n:], loss[i, 3:n] = 1, 0, 1
  return TrainBatch(ids, attn, loss, extras={"advantages": rng.standard_normal(b).astype(np.float32)})


def _params(policy):
  """The HF-named weights and, under LoRA, the adapters (what trains there)."""
  from flax import nnx
  from dockyard.trainer_jax import lora
  out = {k: np.asarray(v) for k, v in hf_io.named_params(policy.model).items()}
  if policy.lora_config is not None:
    out.update({"/".join(map(str, k)): np.asarray(v)
                for k, v in nnx.to_flat_state(nnx.state(policy.model, lora.ADAPTER_FILTER))})
  return out


def _assert_same_step(a, b, pa, pb):
  assert set(a) == set(b), (sorted(a), sorted(b))
  for key in a:
    if key != "lr":
      assert abs(a[key] - b[key]) <= 1e-5 * max(1.0, abs(a[key])), (key, a[key], b[key])
  for name in pa:
    np.testing.assert_allclose(pa[name], pb[name], atol=1e-5, rtol=0, err_msg=name)


# Very uneven lengths: with a bucket of 16 and a budget of 96 tokens the plan's micro-batches
# (rows x length) are 1 x 80, 1 x 64, 2 x 48, 2 x 48, 3 x 32, 2 x 16.
UNEVEN = [70, 9, 33, 12, 61, 40, 5, 47, 14, 26, 30]


def test_token_budget_equals_fixed_micro_batches(tiny_models, config):
  path = tiny_models["qwen2"]
  fixed = _policy(path, config)
  budget = _policy(path, config, micro_batch_tokens=96)
  vocab = fixed.model.config.vocab_size
  batch = _batch(vocab, UNEVEN)
  plan = budget._plan_budget(batch)
  shapes = {(rows, length) for _, rows, length in plan}
  assert sorted(shapes) == [(1, 64), (1, 80), (2, 16), (2, 48), (3, 32)], plan
  assert all(rows * length <= 96 for _, rows, length in plan)
  assert sorted(int(i) for seqs, _, _ in plan for i in seqs) == list(range(len(UNEVEN)))

  lp = fixed.logprobs(batch)
  np.testing.assert_allclose(budget.logprobs(batch), lp, atol=1e-5, rtol=0)
  for loss_fn in (PG, nll_loss):
    if loss_fn is PG:
      step_batch = _with_pg_extras(batch, fixed.logprobs(batch))
      # The micro-batches' losses sum to the whole batch's loss in one piece.
      lm = step_batch.loss_mask
      totals = dict(total_tokens=jnp.float32(lm.sum()), total_sequences=jnp.float32((lm.sum(1) > 0).sum()))
      whole, _ = loss_fn(jnp.asarray(budget.logprobs(step_batch)), jnp.asarray(lm),
                         {**{k: jnp.asarray(v) for k, v in step_batch.extras.items()}, **totals})
    else:
      step_batch, whole = batch, None
    a, b = fixed.train_step(step_batch, loss_fn), budget.train_step(step_batch, loss_fn)
    assert a["grad_norm"] > 0
    if whole is not None:
      assert abs(b["loss"] - float(whole)) <= 1e-5 * max(1.0, abs(float(whole)))
    _assert_same_step(a, b, _params(fixed), _params(budget))

  # Another batch with the same plan shapes: nothing compiles again (the jit cache keys on the
  # model's graphdef, which must compare equal step after step).
  compiles = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, secs, **kw: compiles.append(event)
      if event == "/jax/core/compile/backend_compile_duration" else None)
  again = _batch(vocab, UNEVEN, seed=5)
  budget.train_step(again, nll_loss)
  assert compiles == [], compiles


def test_token_budget_top_k_contract(tiny_models, config):
  path = tiny_models["qwen2"]
  fixed, budget = _policy(path, config), _policy(path, config, micro_batch_tokens=64)
  batch = _batch(fixed.model.config.vocab_size, [30, 8, 21, 17, 5, 26], seed=2)
  rng = np.random.default_rng(2)
  topk = rng.integers(0, fixed.model.config.vocab_size, batch.input_ids.shape + (3,)).astype(np.int32)
  batch = TrainBatch(batch.input_ids, batch.attention_mask, batch.loss_mask,
                     extras={**batch.extras, "topk_ids": topk})
  assert len({length for _, _, length in budget._plan_budget(batch)}) >= 2
  a, b = fixed.train_step(batch, topk_loss), budget.train_step(batch, topk_loss)
  _assert_same_step(a, b, _params(fixed), _params(budget))


def test_token_budget_lora_equals_fixed(tiny_models, config):
  path = tiny_models["qwen2"]
  fixed = _policy(path, config, lora=True)
  budget = _policy(path, config, micro_batch_tokens=96, lora=True)
  batch = _batch(fixed.model.config.vocab_size, UNEVEN, seed=3)
  # Two steps: the second runs with non-zero B (a fresh adapter's B is 0).
  for _ in range(2):
    a, b = fixed.train_step(batch, nll_loss), budget.train_step(batch, nll_loss)
    _assert_same_step(a, b, _params(fixed), _params(budget))


def test_token_budget_moe_equals_fixed(config):
  """Qwen3-MoE with router losses and the balancing bias on. The router losses are per-micro-batch
  means, so they follow the grouping: the batch is laid out so the token budget groups the same
  sequences as the fixed micro-batches (4 of bucket 32, then 4 of bucket 16 padded to 16, not 32)."""
  from dockyard.models.tiny import make_tiny_model
  path = make_tiny_model({"family": "qwen3_moe"})
  moe = dict(aux_loss_coef=0.5, z_loss_coef=0.05, bias_update_rate=0.01)
  fixed = _policy(path, config, moe=moe)
  budget = _policy(path, config, micro_batch_tokens=128, moe=moe)
  batch = _batch(fixed.model.config.vocab_size, [30, 28, 25, 32, 12, 9, 16, 14], seed=4)
  plan = budget._plan_budget(batch)
  assert [(list(s), r, n) for s, r, n in plan] == [([0, 1, 2, 3], 4, 32), ([4, 5, 6, 7], 4, 16)]
  from dockyard.trainer_jax import moe as moe_lib
  bias = lambda p: np.stack([np.asarray(m.expert_bias[...]) for m in moe_lib.sparse_layers(p.model)])
  for step in range(2):   # the second step routes with the first step's updated bias
    a, b = fixed.train_step(batch, nll_loss), budget.train_step(batch, nll_loss)
    assert a["moe_aux_loss"] > 0 and a["moe_z_loss"] > 0 and a["moe_load_max"] > 1
    _assert_same_step(a, b, _params(fixed), _params(budget))
    np.testing.assert_allclose(bias(budget), bias(fixed), atol=1e-7)
    if step == 0:
      assert np.abs(bias(budget)).max() > 0


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (fake) devices, as tests/conftest.py sets")
def test_token_budget_on_a_sharded_mesh_equals_one_device(tiny_models, config):
  """data x fsdp x tensor = 2 x 2 x 2: each micro-batch's rows (rounded up to a multiple of the
  batch axes, 4) split over data and fsdp; the same step as one device's fixed micro-batches."""
  path = tiny_models["qwen2"]
  fixed = _policy(path, config)
  sharded = _policy(path, config, micro_batch_tokens=96, mesh_shape=(2, 2, 2))
  batch = _batch(fixed.model.config.vocab_size, UNEVEN, seed=6)
  assert all(rows % 4 == 0 for _, rows, _ in sharded._plan_budget(batch))
  a, b = fixed.train_step(batch, nll_loss), sharded.train_step(batch, nll_loss)
  _assert_same_step(a, b, _params(fixed), _params(sharded))
