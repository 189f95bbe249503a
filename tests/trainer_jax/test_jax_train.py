"""Train step semantics: micro-batch accumulation, masks, remat, jit cache, learning rates."""
import jax
import numpy as np
import pytest

from dockyard.policy import TrainBatch
from dockyard.trainer_jax import hf_io
from dockyard.trainer_jax import sharding as shd
from dockyard.trainer_jax.loss import nll_loss
from dockyard.trainer_jax.policy import JaxPolicy


def _policy(path, config, **optim):
  config.optim.update(optim)
  mesh = shd.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  return JaxPolicy.from_hf(path, config, mesh=mesh)


def _batch(vocab, b=8, t=40, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, vocab, (b, t)).astype(np.int32)
  attn, loss = np.ones_like(ids), np.zeros_like(ids)
  for i in range(b):
    n = int(rng.integers(t // 2, t + 1))
    ids[i, n:], attn[i, n:] = 0, 0
    loss[i, 6:n] = 1
  adv = rng.standard_normal(b).astype(np.float32)
  return TrainBatch(ids, attn, loss, extras={"advantages": adv})


def pg_like_loss(logprobs, loss_mask, extras):
  """Uses a per-sequence extra and both totals, as the GRPO loss will."""
  per_seq = (logprobs * loss_mask).sum(axis=1) * extras["advantages"]
  loss = -per_seq.sum() / extras["total_tokens"] + 0.0 * extras["total_sequences"]
  return loss, {"seq_term": per_seq.sum() / extras["total_sequences"]}


def _params(policy):
  return {k: np.asarray(v) for k, v in hf_io.named_params(policy.model).items()}


def test_micro_batches_sum_to_the_full_batch(tiny_models, config):
  path = tiny_models["qwen2"]
  whole = _policy(path, config.copy_and_resolve_references(), micro_batch_size=8, warmup_steps=0)
  micro = _policy(path, config.copy_and_resolve_references(), micro_batch_size=2, warmup_steps=0)
  batch = _batch(whole.model.config.vocab_size)
  a = whole.train_step(batch, pg_like_loss)
  b = micro.train_step(batch, pg_like_loss)
  for key in ("loss", "grad_norm", "seq_term"):
    assert abs(a[key] - b[key]) <= 1e-5 * max(1.0, abs(a[key])), (key, a[key], b[key])
  pa, pb = _params(whole), _params(micro)
  for name in pa:
    # 1e-5: Adam divides by sqrt(v), which magnifies float-order noise on near-zero gradients.
    np.testing.assert_allclose(pa[name], pb[name], atol=1e-5, err_msg=name)
  # A batch that is not a whole number of micro-batches is padded with rows that add nothing.
  odd = TrainBatch(batch.input_ids[:5], batch.attention_mask[:5], batch.loss_mask[:5],
                   {"advantages": batch.extras["advantages"][:5]})
  c, d = micro.train_step(odd, pg_like_loss), whole.train_step(odd, pg_like_loss)
  assert abs(c["loss"] - d["loss"]) <= 1e-5 and abs(c["grad_norm"] - d["grad_norm"]) <= 1e-5


def test_loss_counts_only_completion_tokens_and_remat_changes_nothing(tiny_models, config):
  path = tiny_models["qwen2"]
  plain = _policy(path, config.copy_and_resolve_references(), warmup_steps=0)
  cfg = config.copy_and_resolve_references()
  cfg.policy.remat = True
  remat = _policy(path, cfg, warmup_steps=0)
  assert remat.model.remat
  batch = _batch(plain.model.config.vocab_size, seed=1)
  lp = plain.logprobs(batch)
  assert lp.shape == batch.input_ids.shape and np.all(lp[:, 0] == 0)
  assert np.all(lp[batch.attention_mask == 0] == 0)
  expected = -(lp * batch.loss_mask).sum() / batch.loss_mask.sum()
  m = plain.train_step(batch, nll_loss)
  assert abs(m["loss"] - expected) <= 1e-5, (m["loss"], expected)
  assert abs(m["nll"] - expected) <= 1e-5   # the loss is the NLL over the completion tokens alone
  r = remat.train_step(batch, nll_loss)
  assert abs(r["loss"] - m["loss"]) <= 1e-6 and abs(r["grad_norm"] - m["grad_norm"]) <= 1e-5
  pp, pr = _params(plain), _params(remat)
  for name in pp:
    np.testing.assert_allclose(pp[name], pr[name], atol=1e-5, err_msg=name)
  # Changing a prompt-only position's *target* (masked out) leaves the loss unchanged.
  masked_pos = np.argwhere((batch.loss_mask == 0) & (batch.attention_mask == 1))
  i, t = masked_pos[-1]
  assert t >= 1
  tweaked = TrainBatch(batch.input_ids.copy(), batch.attention_mask, batch.loss_mask, batch.extras)
  before = plain.logprobs(tweaked)
  tweaked.loss_mask = batch.loss_mask.copy()
  tweaked.loss_mask[i, t] = 1  # now it is trained on: the loss must change
  assert abs((-(before * tweaked.loss_mask).sum() / tweaked.loss_mask.sum()) - expected) > 1e-6


def test_same_bucket_does_not_recompile_and_lr_follows_schedule(tiny_models, config):
  compiles = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, secs, **kw: compiles.append(event) if event == "/jax/core/compile/backend_compile_duration" else None)
  policy = _policy(tiny_models["qwen3"], config, warmup_steps=2, lr=1e-3, end_lr_factor=0.1)
  vocab = policy.model.config.vocab_size
  first = policy.train_step(_batch(vocab, t=40, seed=0), nll_loss)
  n = len(compiles)
  lrs = [first["lr"]]
  for t in (33, 50, 64):  # all pad to 64
    lrs.append(policy.train_step(_batch(vocab, t=t, seed=t), nll_loss)["lr"])
  assert len(compiles) == n, f"{len(compiles) - n} recompiles for lengths within one bucket"
  assert policy.step == 4
  np.testing.assert_allclose(lrs[:3], [0.0, 5e-4, 1e-3], rtol=1e-6)  # linear warmup over 2 steps
  assert lrs[3] < 1e-3  # cosine decay has begun
  policy.set_lr(3e-3)  # SFT-style constant rate, no recompile
  for _ in range(2):
    assert policy.train_step(_batch(vocab, t=40), nll_loss)["lr"] == pytest.approx(3e-3)
  assert len(compiles) == n
  policy.set_lr(None)
  # The two override steps did not advance the schedule: it resumes at its step 4, not 6.
  from dockyard.trainer_jax import train
  sched = train.lr_schedule(policy.optim, policy.total_steps)
  assert policy.train_step(_batch(vocab, t=40), nll_loss)["lr"] == pytest.approx(float(sched(4)), rel=1e-6)
  assert float(sched(4)) != pytest.approx(float(sched(6)))
  with pytest.raises(ValueError, match="learning rate"):
    policy.set_lr(-1.0)


def test_a_varying_micro_batch_count_shares_one_compile(tiny_models, config):
  """Dynamic sampling keeps a different number of groups each step: 5..8 rows at micro-batch 2
  are 3 or 4 micro-batches, padded to 4 (a traced count says how many are real). One compile of
  the step, and each step's loss is the loss of its rows (from `logprobs`, before the update)."""
  compiles = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, secs, **kw: compiles.append(event) if event == "/jax/core/compile/backend_compile_duration" else None)
  path = tiny_models["qwen2"]
  micro = _policy(path, config.copy_and_resolve_references(), micro_batch_size=2, warmup_steps=0)
  vocab = micro.model.config.vocab_size
  micro.train_step(_batch(vocab, b=8, t=40, seed=9), pg_like_loss)   # compiles n_cap=4
  for rows in (5, 6, 7, 8):
    full = _batch(vocab, b=8, t=40, seed=rows)
    batch = TrainBatch(full.input_ids[:rows], full.attention_mask[:rows], full.loss_mask[:rows],
                       {"advantages": full.extras["advantages"][:rows]})
    a = micro.logprobs(batch)
    before = len(compiles)
    m = micro.train_step(batch, pg_like_loss)
    assert len(compiles) == before, f"{rows} rows recompiled the step"
    expected = pg_like_loss(a, batch.loss_mask.astype(np.float32),
                            {"advantages": batch.extras["advantages"],
                             "total_tokens": batch.loss_mask.sum(), "total_sequences": rows})[0]
    assert abs(m["loss"] - float(expected)) <= 1e-5 * max(1.0, abs(float(expected))), (rows, m["loss"], expected)


def test_warm_start_steps_do_not_advance_the_schedule_in_the_update(tiny_models, config):
  """A warm start under set_lr, then the schedule: its step 0 (warmup from 0) must leave the
  parameters unchanged. Before the fix the schedule read step 3 and they moved."""
  policy = _policy(tiny_models["qwen2"], config, warmup_steps=2, lr=1e-3, end_lr_factor=0.1)
  vocab = policy.model.config.vocab_size
  policy.set_lr(3e-3)
  for seed in range(3):
    policy.train_step(_batch(vocab, t=40, seed=seed), nll_loss)
  policy.set_lr(None)
  before = {k: np.array(v) for k, v in policy.named_weights()}
  assert policy.train_step(_batch(vocab, t=40, seed=9), nll_loss)["lr"] == 0.0
  after = dict(policy.named_weights())
  for k, v in before.items():
    np.testing.assert_array_equal(after[k], v, err_msg=k)
  assert policy.train_step(_batch(vocab, t=40, seed=10), nll_loss)["lr"] == pytest.approx(5e-4)
  assert any(not np.array_equal(np.asarray(v), before[k]) for k, v in policy.named_weights())


def test_named_weights_stream_hf_layout(tiny_models, config):
  from safetensors.numpy import load_file
  import os
  policy = _policy(tiny_models["llama"], config)
  named = dict(policy.named_weights())
  on_disk = load_file(os.path.join(tiny_models["llama"], "model.safetensors"))
  assert set(named) == set(on_disk)
  for name, arr in on_disk.items():
    np.testing.assert_array_equal(named[name], arr, err_msg=name)


def test_bad_batches_are_rejected(tiny_models, config):
  policy = _policy(tiny_models["qwen2"], config)
  b = _batch(policy.model.config.vocab_size)
  with pytest.raises(ValueError, match="loss_mask shape"):
    policy.train_step(TrainBatch(b.input_ids, b.attention_mask, b.loss_mask[:, :3]), nll_loss)
  with pytest.raises(ValueError, match="batch dimension 3"):
    policy.train_step(TrainBatch(b.input_ids, b.attention_mask, b.loss_mask,
                                 {"advantages": np.zeros(3, np.float32)}), nll_loss)


def _left_padded(b: TrainBatch) -> TrainBatch:
  """The same rows with their padding moved to the front."""
  ids, attn, loss = (np.zeros_like(x) for x in (b.input_ids, b.attention_mask, b.loss_mask))
  for i in range(b.batch_size):
    n = int(b.attention_mask[i].sum())
    ids[i, -n:], attn[i, -n:], loss[i, -n:] = b.input_ids[i, :n], 1, b.loss_mask[i, :n]
  return TrainBatch(ids, attn, loss, b.extras)


def test_left_padding_and_bad_temperature_are_rejected(tiny_models, config):
  policy = _policy(tiny_models["qwen2"], config)
  b = _batch(policy.model.config.vocab_size)
  left = _left_padded(b)
  for call in (lambda: policy.logprobs(left), lambda: policy.train_step(left, nll_loss)):
    with pytest.raises(ValueError, match="not right-padded"):
      call()
  for t in (0.0, -1.0, float("nan")):
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
      policy.logprobs(TrainBatch(b.input_ids, b.attention_mask, b.loss_mask, temperature=t))
  assert policy.step == 0


def test_temperature_divides_the_logits_in_logprobs_and_train_step(tiny_models, config):
  """logprobs(batch at T) is log_softmax(logits / T); train_step feeds the loss the same: with
  prev = logprobs at T the PPO ratio is exactly 1, with the raw T=1 logprobs it is not."""
  import jax.numpy as jnp
  from dockyard.grpo.loss_spec import LossConfig
  from dockyard.trainer_jax import loss as jax_loss
  policy = _policy(tiny_models["qwen2"], config)
  policy.set_lr(0.0)   # weights stay put, so both steps below see the same model
  b = _batch(policy.model.config.vocab_size, seed=3)
  hot = TrainBatch(b.input_ids, b.attention_mask, b.loss_mask, b.extras, temperature=0.7)
  lp_hot, lp_raw = policy.logprobs(hot), policy.logprobs(b)
  logits = policy.model(jnp.asarray(b.input_ids), jnp.asarray(b.attention_mask))
  want = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits[:, :-1] / 0.7, axis=-1)),
                            b.input_ids[:, 1:, None], axis=-1)[..., 0] * b.attention_mask[:, 1:]
  np.testing.assert_allclose(lp_hot[:, 1:], want, atol=1e-5)
  m = b.loss_mask > 0
  assert np.abs(lp_hot - lp_raw)[m].mean() > 0.01   # T=0.7 is another distribution (>> 1e-5)
  pg = jax_loss.make_pg_loss(LossConfig(use_importance_sampling_correction=False))

  def loss(lp, mask, extras):   # the PG loss, plus how far the trained logprobs are from prev
    value, metrics = pg(lp, mask, extras)
    gap = (jnp.abs(lp - extras["prev_logprobs"]) * mask).sum() / extras["total_tokens"]
    return value, {**metrics, "abs_log_ratio": gap}
  extras = {**b.extras, "prev_logprobs": lp_hot.astype(np.float32)}
  at_t = policy.train_step(TrainBatch(b.input_ids, b.attention_mask, b.loss_mask, extras, 0.7), loss)
  at_1 = policy.train_step(TrainBatch(b.input_ids, b.attention_mask, b.loss_mask, extras), loss)
  assert at_t["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
  assert at_t["abs_log_ratio"] < 1e-5 and at_t["clip_fraction"] == 0.0
  assert at_1["abs_log_ratio"] > 0.01
