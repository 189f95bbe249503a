"""LoRA on the JAX trainer: merge == adapter forward, frozen base, optimizer state for the adapters
alone, adapter-only checkpoints that load back onto the base, dropout that really drops, a step
that lowers the loss, and the same numbers on a sharded mesh."""
import os

import jax
import numpy as np
import pytest
from flax import nnx

from dockyard.models import lora as lora_cfg
from dockyard.models import name_map
from dockyard.policy import TrainBatch
from dockyard.trainer_jax import loss as losses
from dockyard.trainer_jax import lora
from dockyard.trainer_jax.policy import JaxPolicy


def _lora_config(config, **kw):
  cfg = config.copy_and_resolve_references()
  cfg.policy.lora.enabled = True
  cfg.policy.lora.rank = 4
  cfg.policy.lora.alpha = 8.0
  for k, v in kw.items():
    cfg.policy.lora[k] = v
  cfg.optim.lr = 1e-2
  return cfg


def _batch(seed=0, b=8, t=20, vocab=1024):
  rng = np.random.default_rng(seed)
  ids = rng.integers(3, vocab, (b, t)).astype(np.int32)
  am = np.ones_like(ids)
  am[-1, t - 5:] = 0
  lm = (am > 0).astype(np.float32)
  lm[:, :4] = 0
  return TrainBatch(ids, am, lm)


def _randomize_adapters(policy, seed=0):
  """Non-zero b (a fresh adapter is an exact no-op), so the merge has something to merge."""
  rng = np.random.default_rng(seed)
  for adapter in lora.adapters(policy.model).values():
    b = adapter.lora_b[...]
    adapter.lora_b.set_value(jax.device_put(rng.normal(0, 0.05, b.shape).astype(np.float32), b.sharding))


def _base(policy):
  return {k: np.asarray(v) for k, v in nnx.to_flat_state(nnx.state(policy.model, lora.BASE_FILTER))}


@pytest.fixture(scope="module")
def qwen2(tiny_models):
  return tiny_models["qwen2"]   # q/k/v biases: the adapters sit beside them


@pytest.fixture(scope="module")
def trained(qwen2, tmp_path_factory):
  """One LoRA policy (all 7 projections) before and after 3 steps, and its checkpoint; shared so
  that the step compiles once for the whole module."""
  from dockyard.validate import load_config_file
  config = load_config_file(os.path.join(os.path.dirname(__file__), "..", "..", "configs", "swe.py"))
  config.mesh.shape = (1, 1, 1)
  cfg = _lora_config(config)
  policy = JaxPolicy.from_hf(qwen2, cfg)
  out = dict(cfg=cfg, policy=policy, base=_base(policy), batch=_batch())
  out["opt_arrays"] = {".".join(map(str, k)): v.get_value()
                       for k, v in nnx.to_flat_state(nnx.state(policy.optimizer.opt_state))
                       if np.ndim(v.get_value()) > 0}
  out["losses"] = [policy.train_step(out["batch"], losses.nll_loss)["loss"] for _ in range(3)]
  out["ckpt"] = str(tmp_path_factory.mktemp("lora_ckpt"))
  policy.save(out["ckpt"])
  return out


def test_step_trains_adapters_only_and_lowers_the_loss(trained):
  policy, opt_arrays = trained["policy"], trained["opt_arrays"]
  # Optimizer state: moments for the adapters alone (every array with a shape is an adapter's).
  assert opt_arrays and all(k.endswith(("lora_a", "lora_b")) for k in opt_arrays), sorted(opt_arrays)[:5]
  adapter_size = sum(v.size for v in jax.tree.leaves(nnx.state(policy.model, nnx.LoRAParam)))
  assert sum(v.size for v in opt_arrays.values()) == 2 * adapter_size   # mu and nu
  assert trained["losses"][-1] < trained["losses"][0] - 0.05, trained["losses"]
  after = _base(policy)
  for k, v in trained["base"].items():
    np.testing.assert_array_equal(v, after[k], err_msg=k)
  assert all(np.abs(np.asarray(a.lora_b[...])).max() > 0 for a in lora.adapters(policy.model).values())


def test_merged_export_equals_the_adapter_forward(trained, qwen2, config, tmp_path):
  policy, batch = trained["policy"], trained["batch"]
  assert len(lora.adapters(policy.model)) == 2 * len(lora_cfg.TARGETS)   # 2 layers, all 7 projections
  adapted = policy.logprobs(batch)
  plain = JaxPolicy.from_hf(qwen2, config)   # the base, no LoRA
  assert np.abs(adapted - plain.logprobs(batch)).max() > 1e-3   # the adapters matter
  policy.save_hf(str(tmp_path / "merged"))
  merged = JaxPolicy.from_hf(str(tmp_path / "merged"), config)
  np.testing.assert_allclose(merged.logprobs(batch), adapted, atol=1e-5)
  # The refit stream: the touched tensors only, equal to the export's projections.
  touched = dict(policy.named_weights(touched_only=True))
  entries = name_map.lora_entries(policy.model.config, lora_cfg.TARGETS)
  assert sorted(touched) == sorted(e.hf for e in entries)
  full = dict(merged.named_weights())
  for name, arr in touched.items():
    np.testing.assert_allclose(arr, full[name], atol=1e-6, err_msg=name)


def test_adapter_checkpoint_round_trips_onto_the_base(trained, qwen2, config):
  policy, batch, ckpt = trained["policy"], trained["batch"], trained["ckpt"]
  written = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(ckpt) for f in fs)
  base_bytes = sum(v.nbytes for v in trained["base"].values())
  assert written < 0.5 * base_bytes, (written, base_bytes)   # adapters + their moments, no base

  fresh = JaxPolicy.from_hf(qwen2, trained["cfg"])   # the base + new (zero) adapters
  fresh.restore(ckpt)
  assert fresh.step == policy.step == 3
  np.testing.assert_array_equal(fresh.logprobs(batch), policy.logprobs(batch))
  # Training goes on identically (Adam moments and step restored too); without dropout two steps
  # at rate 0 see the same loss (the control for the dropout test below).
  np.testing.assert_allclose(fresh.train_step(batch, losses.nll_loss)["loss"],
                             policy.train_step(batch, losses.nll_loss)["loss"], rtol=1e-6)
  fresh.set_lr(0.0)
  assert fresh.train_step(batch, losses.nll_loss)["loss"] == fresh.train_step(batch, losses.nll_loss)["loss"]

  with pytest.raises(ValueError, match="policy.lora.rank"):
    JaxPolicy.from_hf(qwen2, _lora_config(config, rank=8)).restore(ckpt)
  with pytest.raises(ValueError, match="policy.lora.enabled"):
    JaxPolicy.from_hf(qwen2, config).restore(ckpt)


def test_dropout_draws_fresh_masks_only_in_training(qwen2, config):
  batch = _batch()
  policy = JaxPolicy.from_hf(qwen2, _lora_config(config, dropout=0.5, targets=("q_proj",)))  # small: compiles faster
  _randomize_adapters(policy)
  policy.set_lr(0.0)   # the weights stay put: only the masks can change the loss
  first, second = (policy.train_step(batch, losses.nll_loss)["loss"] for _ in range(2))
  assert first != second
  np.testing.assert_array_equal(policy.logprobs(batch), policy.logprobs(batch))   # eval: no dropout


def test_sharded_adapters_match_one_device(qwen2, config):
  if jax.device_count() < 4:
    pytest.skip(f"needs 4 devices, JAX has {jax.device_count()}")
  batch = _batch()
  out = []
  for shape in ((1, 1, 1), (1, 2, 2)):   # (2, 2): embed over fsdp, heads / mlp over tensor
    cfg = _lora_config(config)
    cfg.mesh.shape = shape
    cfg.cluster.cpu_devices = int(np.prod(shape))
    policy = JaxPolicy.from_hf(qwen2, cfg)
    _randomize_adapters(policy)
    out.append(policy.logprobs(batch))
  np.testing.assert_allclose(out[0], out[1], atol=2e-5)


def test_remat_trains_the_same_adapters(trained, qwen2):
  """`policy.remat` (jax.checkpoint per layer, on in the full variants) with LoRA: the same three
  steps as without it (it raised TraceContextError: the frozen base was a Variable of the outer
  trace that nnx.remat wrote back)."""
  cfg = trained["cfg"].copy_and_resolve_references()
  cfg.policy.remat = True
  policy = JaxPolicy.from_hf(qwen2, cfg)
  got = [policy.train_step(trained["batch"], losses.nll_loss)["loss"] for _ in range(3)]
  np.testing.assert_allclose(got, trained["losses"], rtol=1e-5)
  assert got[-1] < got[0]
