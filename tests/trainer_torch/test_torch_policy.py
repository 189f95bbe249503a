"""TorchPolicy in one process (a one-rank FSDP2 mesh): sharding, logprobs, micro-batching, the
optimizer's semantics against optax, refit names through the name-map, input errors, the factory."""
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

import torch_common
from dockyard.policy import TrainBatch
from dockyard.models import name_map
from dockyard.trainer_torch import optim
from dockyard.trainer_torch.loss import make_pg_loss


def test_parameters_are_fsdp2_dtensors(build_policy):
  from torch.distributed.fsdp import FSDPModule
  from torch.distributed.tensor import DTensor, Shard
  policy = build_policy()
  assert isinstance(policy.model, FSDPModule)
  assert all(isinstance(layer, FSDPModule) for layer in policy.model.model.layers)
  for name, p in policy.model.named_parameters():
    assert isinstance(p, DTensor), name
    assert p.placements == (Shard(0),), name
    assert p.device_mesh.mesh_dim_names == ("fsdp",)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_the_plain_hf_model_and_ignore_padding(build_policy, model_path, temperature):
  import transformers
  policy = build_policy(micro_batch_size=3)
  batch = torch_common.make_batch(seed=3)
  batch.temperature = temperature   # log_softmax(logits / T): the distribution sampled at T
  scored, inner = [], policy._logprobs
  policy._logprobs = lambda ids, *a: (scored.append(len(ids)), inner(ids, *a))[1]
  got = policy.logprobs(batch)
  assert got.shape == batch.input_ids.shape and got.dtype == np.float32
  assert sum(scored) == batch.batch_size, scored   # the last micro-batch's padding rows not scored
  assert np.all(got[:, 0] == 0)
  ref_model = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
  with torch.no_grad():
    for i in range(batch.batch_size):   # each row alone, unpadded
      n = int(batch.attention_mask[i].sum())
      ids = torch.as_tensor(batch.input_ids[i:i + 1, :n], dtype=torch.long)
      logp = torch.log_softmax(ref_model(input_ids=ids).logits[0, :-1].float() / temperature, -1)
      want = logp.gather(-1, ids[0, 1:, None])[:, 0].numpy()
      np.testing.assert_allclose(got[i, 1:n], want, atol=1e-5, rtol=0)


def test_micro_batching_gives_the_same_step(build_policy):
  """7 rows as 1 micro-batch of 8 (one padding row) vs 4 micro-batches of 2: same loss, grad
  norm, metrics and updated weights (the LossFn contract's totals at work)."""
  batch = torch_common.make_batch(seed=4)
  results = []
  for mbs in (8, 2):
    policy = build_policy(micro_batch_size=mbs, warmup_steps=0)
    before = dict(policy.named_weights())
    b = torch_common.with_prev(batch, policy.logprobs(batch))
    metrics = policy.train_step(b, make_pg_loss(torch_common.loss_config(policy.config)))
    results.append((metrics, dict(policy.named_weights()), before))
  (m8, w8, before), (m2, w2, _) = results
  assert m8["grad_norm"] > 0.5   # above optim.max_grad_norm: clipping was active
  assert m8["lr"] == pytest.approx(1e-3)
  for k in m8:
    assert m2[k] == pytest.approx(m8[k], rel=1e-5, abs=1e-7), k
  moved = 0
  for name in w8:
    np.testing.assert_allclose(w2[name], w8[name], rtol=0, atol=1e-6, err_msg=name)
    moved += int(np.abs(w8[name] - before[name]).max() > 1e-5)
  assert moved == len(w8), "every parameter should move after an AdamW step with lr 1e-3"


def test_optimizer_matches_optax_clip_adamw_and_schedule():
  """clip_by_global_norm + adamw(warmup_cosine_decay_schedule), 4 steps, on two tensors."""
  import jax.numpy as jnp
  import optax
  cfg = torch_common.make_config(warmup_steps=2)
  o, total = dict(cfg.optim), 6
  for o["decay_steps"] in (0, 5):   # 0: decay over the run's steps (total); else its own horizon
    horizon = o["decay_steps"] or total
    ref = optax.warmup_cosine_decay_schedule(0.0, o["lr"], o["warmup_steps"], horizon,
                                             o["lr"] * o["end_lr_factor"])
    for step in range(9):
      assert optim.lr_at(step, o, total) == pytest.approx(float(ref(step)), rel=1e-6, abs=1e-12), (
          o["decay_steps"], step)
  o["decay_steps"] = 0
  sched = optax.warmup_cosine_decay_schedule(0.0, o["lr"], o["warmup_steps"], total, o["lr"] * o["end_lr_factor"])
  tx = optax.chain(optax.clip_by_global_norm(o["max_grad_norm"]),
                   optax.adamw(sched, b1=o["b1"], b2=o["b2"], eps=o["eps"], weight_decay=o["weight_decay"]))
  rng = np.random.default_rng(0)
  init = [rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(5,)).astype(np.float32)]
  params_j = [jnp.asarray(x) for x in init]
  state = tx.init(params_j)
  params_t = [torch.nn.Parameter(torch.tensor(x)) for x in init]
  opt = optim.make_optimizer(params_t, o)
  for step in range(4):
    scale = 0.1 if step % 2 else 2.0   # alternate clipped and unclipped steps
    grads = [rng.normal(size=x.shape).astype(np.float32) * scale for x in init]
    updates, state = tx.update([jnp.asarray(g) for g in grads], state, params_j)
    params_j = optax.apply_updates(params_j, updates)
    for p, g in zip(params_t, grads):
      p.grad = torch.tensor(g)
    gs = [p.grad for p in params_t]
    norm = optim.global_norm(gs)
    assert float(norm) == pytest.approx(float(optax.global_norm([jnp.asarray(g) for g in grads])), rel=1e-6)
    optim.clip_(gs, norm, o["max_grad_norm"])
    for group in opt.param_groups:
      group["lr"] = optim.lr_at(step, o, total)
    opt.step()
  for pj, pt in zip(params_j, params_t):
    np.testing.assert_allclose(pt.detach().numpy(), np.asarray(pj), rtol=0, atol=1e-6)
  assert not np.allclose(params_t[0].detach().numpy(), init[0], atol=1e-4)


def test_named_weights_are_the_checkpoint_in_name_map_order(build_policy, model_path):
  policy = build_policy()
  names, arrays = zip(*policy.named_weights())
  assert list(names) == [e.hf for e in name_map.table(policy.model_config)]
  on_disk = load_file(f"{model_path}/model.safetensors")
  for name, arr in zip(names, arrays):
    assert isinstance(arr, np.ndarray) and arr.dtype == np.float32
    np.testing.assert_array_equal(arr, on_disk[name], err_msg=name)
  assert "lm_head.weight" not in names   # tied: vLLM ties it from the embeddings


def test_bad_batches_name_the_problem(build_policy):
  policy = build_policy()
  good = torch_common.make_batch()
  loss_fn = make_pg_loss(torch_common.loss_config(policy.config))
  cases = [
      (TrainBatch(good.input_ids, good.attention_mask[:, :-1], good.loss_mask, good.extras), "attention_mask"),
      (TrainBatch(good.input_ids + 10_000, good.attention_mask, good.loss_mask, good.extras), "out of range"),
      (TrainBatch(good.input_ids, good.attention_mask, good.loss_mask,
                  {**good.extras, "advantages": good.extras["advantages"][:3]}), "advantages"),
      (TrainBatch(np.zeros((1, 600), np.int32), np.ones((1, 600)), np.ones((1, 600))), "max_seq_len"),
  ]
  for batch, message in cases:
    with pytest.raises(ValueError, match=message):
      policy.train_step(batch, loss_fn)
  with pytest.raises(KeyError, match="generation_logprobs"):
    extras = {k: v for k, v in good.extras.items() if k != "generation_logprobs"}
    policy.train_step(TrainBatch(good.input_ids, good.attention_mask, good.loss_mask, extras), loss_fn)
  assert policy.step == 0


def test_factory_picks_the_backend_and_its_losses(model_path):
  from dockyard import policy_factory
  from dockyard.trainer_torch import loss as torch_loss
  from dockyard.trainer_torch.policy import TorchPolicy
  cfg = torch_common.make_config()
  assert cfg.policy.backend == "torch"     # configs/swe.py:torch selects this backend
  assert isinstance(policy_factory.make_policy(cfg, model_path), TorchPolicy)
  assert policy_factory.make_loss(cfg, "nll") is torch_loss.nll_loss
  lp, mask = torch.zeros(1, 3, requires_grad=True), torch.tensor([[0.0, 1.0, 1.0]])
  extras = dict(advantages=torch.tensor([1.0]), prev_logprobs=torch.zeros(1, 3),
                generation_logprobs=torch.zeros(1, 3))
  loss, _ = policy_factory.make_loss(cfg, "pg")(lp, mask, extras)
  assert isinstance(loss, torch.Tensor) and float(loss.detach()) == pytest.approx(-1.0)   # -A * ratio 1
  with pytest.raises(ValueError, match="loss kind"):
    policy_factory.make_loss(cfg, "dpo")
  cfg.policy.backend = "tensorflow"
  with pytest.raises(ValueError, match="policy.backend"):
    policy_factory.make_policy(cfg, model_path)


def test_checkpoints_keep_latest_and_restore_bookkeeping(build_policy, tmp_path):
  """Same calls as JaxPolicy: save(dir, data_iter) -> dir/<step>/; restore -> meta."""
  import grain
  policy = build_policy(warmup_steps=0)
  directory = str(tmp_path / "ckpt")
  loss_fn = make_pg_loss(torch_common.loss_config(policy.config))
  it = iter(grain.MapDataset.range(100).to_iter_dataset())
  for step in range(3):
    batch = torch_common.make_batch(seed=step)
    policy.train_step(torch_common.with_prev(batch, policy.logprobs(batch)), loss_fn)
    next(it)
    if step == 2:
      policy.set_lr(0.123)
    policy.save(directory, data_iter=it)
  assert policy.checkpointer(directory).all_steps() == [3]   # the latest
  weights = dict(policy.named_weights())

  fresh = build_policy(warmup_steps=0)
  fresh_it = iter(grain.MapDataset.range(100).to_iter_dataset())
  meta = fresh.restore(directory, data_iter=fresh_it)
  assert (fresh.step, meta["lr_override"]) == (3, 0.123)
  assert next(fresh_it) == 3
  for name, arr in fresh.named_weights():
    np.testing.assert_array_equal(arr, weights[name], err_msg=name)
  batch = torch_common.make_batch(seed=9)
  assert fresh.train_step(torch_common.with_prev(batch, fresh.logprobs(batch)), loss_fn)["lr"] == 0.123
  # Lifting the override: the schedule resumes at the 3 steps taken on it (not at step 4).
  fresh.set_lr(None)
  lr = fresh.train_step(torch_common.with_prev(batch, fresh.logprobs(batch)), loss_fn)["lr"]
  assert lr == pytest.approx(optim.lr_at(3, fresh._optim, fresh._total_steps))
  assert lr != pytest.approx(optim.lr_at(4, fresh._optim, fresh._total_steps))
  with pytest.raises(FileNotFoundError):
    fresh.restore(directory, step=2)   # pruned: only the latest is kept
  with pytest.raises(ValueError, match="learning rate"):
    fresh.set_lr(-1.0)


def test_bfloat16_compute_with_remat_keeps_fp32_master_weights(build_policy):
  """policy.dtype=bfloat16 -> FSDP2 mixed precision (bf16 all-gather + compute, fp32 reduce and
  master weights); policy.remat -> activation checkpointing. The step must stay close to fp32's."""
  batch = torch_common.make_batch(seed=7)
  out = {}
  for dtype, remat in (("float32", False), ("bfloat16", True)):
    policy = build_policy(dtype=dtype, remat=remat, warmup_steps=0)
    lp = policy.logprobs(batch)
    metrics = policy.train_step(torch_common.with_prev(batch, lp),
                                make_pg_loss(torch_common.loss_config(policy.config)))
    assert all(p.dtype == torch.float32 for p in policy.model.parameters())
    assert policy.model.model.gradient_checkpointing == remat
    out[dtype] = lp, metrics
  (lp32, m32), (lp16, m16) = out["float32"], out["bfloat16"]
  diff = np.abs(lp32 - lp16)[batch.attention_mask > 0]
  assert 0 < diff.max() < 0.1    # bf16 really ran, and is only rounding away from fp32
  assert np.isfinite(m16["loss"]) and m16["grad_norm"] == pytest.approx(m32["grad_norm"], rel=0.05)


def test_train_step_trains_the_tempered_distribution(build_policy):
  """train_step feeds the loss log_softmax(logits / T), as `logprobs` scores: with prev = the
  policy's own logprobs at T the PPO ratio is exactly 1; against the raw T=1 logprobs it is not."""
  from dockyard.grpo.loss_spec import LossConfig
  policy = build_policy(micro_batch_size=4)
  policy.set_lr(0.0)   # weights stay put: both steps see the same model
  batch = torch_common.make_batch(seed=8)
  hot = TrainBatch(batch.input_ids, batch.attention_mask, batch.loss_mask, batch.extras, 0.7)
  lp_hot, lp_raw = policy.logprobs(hot), policy.logprobs(batch)
  m = batch.loss_mask > 0
  assert np.abs(lp_hot - lp_raw)[m].mean() > 0.01   # >> the 1e-5 agreement above
  pg = make_pg_loss(LossConfig(use_importance_sampling_correction=False))

  def loss_fn(lp, mask, extras):   # the PG loss, plus how far the trained logprobs are from prev
    loss, metrics = pg(lp, mask, extras)
    gap = ((lp - extras["prev_logprobs"]).abs() * mask).sum() / extras["total_tokens"]
    return loss, {**metrics, "abs_log_ratio": gap.detach()}
  extras = {**batch.extras, "prev_logprobs": lp_hot}
  at_t = policy.train_step(TrainBatch(batch.input_ids, batch.attention_mask, batch.loss_mask, extras, 0.7), loss_fn)
  at_1 = policy.train_step(TrainBatch(batch.input_ids, batch.attention_mask, batch.loss_mask, extras), loss_fn)
  assert at_t["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
  assert at_t["abs_log_ratio"] < 1e-5 and at_t["clip_fraction"] == 0.0
  assert at_1["abs_log_ratio"] > 0.01


def test_left_padding_is_rejected(build_policy):
  policy = build_policy()
  batch = torch_common.make_batch(seed=9)
  left = TrainBatch(np.flip(batch.input_ids, 1), np.flip(batch.attention_mask, 1),
                    np.flip(batch.loss_mask, 1), batch.extras)
  with pytest.raises(ValueError, match="not right-padded"):
    policy.logprobs(left)
  with pytest.raises(ValueError, match="not right-padded"):
    policy.train_step(torch_common.with_prev(left, np.zeros(left.input_ids.shape, np.float32)),
                      make_pg_loss(torch_common.loss_config(policy.config)))
  assert policy.step == 0
