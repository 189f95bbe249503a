"""A quantized frozen base under LoRA (`policy.lora.base_quant`, `dockyard.trainer_jax.quant`):
each format's round-trip error within its bound (NF4's codes are QLoRA's 16 levels), the
quantized model's logprobs equal to a plain model loaded with the dequantized weights (the
export), a step that trains the adapters alone and lowers the loss with the codes untouched,
adapter checkpoints that load back onto a quantized base, and a sharded mesh that agrees with
one device."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dockyard.trainer_jax import loss as losses
from dockyard.trainer_jax import lora, quant
from dockyard.trainer_jax.model import Dense, HeadsProj, OutProj
from dockyard.trainer_jax.policy import JaxPolicy
from tests.trainer_jax.test_jax_lora import _batch, _randomize_adapters


def _qlora_config(config, base_quant, **kw):
  cfg = config.copy_and_resolve_references()
  cfg.policy.lora.update(enabled=True, rank=4, alpha=8.0, base_quant=base_quant, **kw)
  cfg.optim.lr = 1e-2
  return cfg


def _raw(policy):
  """Every quantized weight's codes and scales, on the host."""
  return {f"{k}.{part}": np.asarray(x) for k, v in quant.quantized_weights(policy.model).items()
          for part, x in v.get_raw_value().items()}


# --- the formats -----------------------------------------------------------------------------

@pytest.mark.parametrize("shape, reduce_axes", [((48, 100), (0,)), ((32, 4, 16), (0,)),
                                                ((4, 16, 32), (0, 1)), ((64, 128), (1,))])
def test_int8_error_is_within_half_a_step_per_output_channel(shape, reduce_axes):
  w = np.random.default_rng(0).normal(0, 0.02, shape).astype(np.float32)
  q = quant.quantize(jnp.asarray(w), "int8", reduce_axes)
  assert q["codes"].dtype == jnp.int8 and q["codes"].shape == shape
  absmax = np.abs(w).max(axis=reduce_axes, keepdims=True)
  np.testing.assert_allclose(np.asarray(q["scales"]), absmax / 127, rtol=1e-6)
  err = np.abs(np.asarray(quant.dequantize(q, "int8", shape)) - w)
  assert np.all(err <= quant.ERROR_BOUND["int8"] * absmax * (1 + 1e-5) + 1e-12)
  assert np.abs(np.asarray(q["codes"])).max() == 127   # each channel's absmax maps to +-127


@pytest.mark.parametrize("shape, flat", [((48, 128), 128), ((32, 4, 64), 64), ((32, 4, 32), 128),
                                         ((3, 100), 100)])   # (32, 4, 32): blocks across heads; (3, 100): ragged
def test_nf4_error_is_within_half_a_level_gap_per_block(shape, flat):
  assert int(np.prod(shape[len(shape) - quant.nf4_trailing(shape):])) == flat
  w = np.random.default_rng(1).normal(0, 0.02, shape).astype(np.float32)
  q = quant.quantize(jnp.asarray(w), "nf4")
  lead, nb = shape[:len(shape) - quant.nf4_trailing(shape)], -(-flat // 64)
  assert q["codes"].dtype == jnp.uint8 and q["codes"].shape == lead + (nb * 32,)
  assert q["scales"].shape == lead + (nb,)
  padded = np.pad(w.reshape(lead + (flat,)), [(0, 0)] * len(lead) + [(0, nb * 64 - flat)])
  absmax = np.abs(padded.reshape(lead + (nb, 64))).max(axis=-1)
  np.testing.assert_allclose(np.asarray(q["scales"]), absmax, rtol=1e-6)
  bound = (np.repeat(absmax, 64, axis=-1)[..., :flat] * quant.ERROR_BOUND["nf4"]).reshape(shape)
  err = np.abs(np.asarray(quant.dequantize(q, "nf4", shape)) - w)
  assert np.all(err <= bound * (1 + 1e-5)), (err / bound).max()
  # Each element goes to its nearest level: no other level is closer.
  normed = padded.reshape(lead + (nb, 64)) / absmax[..., None]
  codes = np.asarray(quant.nf4_codes(q)).reshape(normed.shape)
  dist = np.abs(normed[..., None] - quant.NF4_LEVELS)
  picked = np.take_along_axis(dist, codes[..., None].astype(np.int64), -1)[..., 0]
  np.testing.assert_allclose(picked, dist.min(-1), atol=1e-6)


def test_nf4_codes_reproduce_the_16_levels_exactly():
  scale = 0.37
  w = np.tile(quant.NF4_LEVELS * scale, 4).reshape(1, 64)   # one block; its absmax is the scale
  q = quant.quantize(jnp.asarray(w), "nf4")
  np.testing.assert_array_equal(np.asarray(quant.nf4_codes(q))[0], np.tile(np.arange(16), 4))
  np.testing.assert_array_equal(np.asarray(quant.dequantize(q, "nf4", (1, 64))),
                                (quant.NF4_LEVELS * np.float32(scale)).reshape(1, 16).repeat(4, 0).reshape(1, 64))
  assert len(quant.NF4_LEVELS) == 16 and quant.NF4_LEVELS[7] == 0.0
  assert quant.NF4_LEVELS[0] == -1.0 and quant.NF4_LEVELS[-1] == 1.0
  # 4 bits a code + one fp32 scale per 64: 0.5625 B/param.
  assert q["codes"].nbytes + q["scales"].nbytes == 64 * 0.5625


# --- the quantized model -----------------------------------------------------------------------

@pytest.mark.parametrize("family, base_quant", [("qwen2", "nf4"), ("llama", "int8")])  # tied / untied head
def test_quantized_forward_equals_the_dequantized_weights(tiny_models, config, tmp_path, family, base_quant):
  path = tiny_models[family]
  policy = JaxPolicy.from_hf(path, _qlora_config(config, base_quant))
  model = policy.model
  # Every projection kernel and the embedding is quantized; no base nnx.Param kernel is left.
  for _, module in model.iter_modules():
    if isinstance(module, (HeadsProj, OutProj, Dense)):
      assert isinstance(module.kernel, quant.QuantizedWeight)
  assert isinstance(model.embed.embedding, quant.QuantizedWeight)
  assert not any(k.endswith(("kernel", "embedding")) for k in
                 (".".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(model, lora.BASE_FILTER))))
  plain = JaxPolicy.from_hf(path, config)
  batch = _batch()
  quantized_lp = policy.logprobs(batch)
  assert 1e-4 < np.abs(quantized_lp - plain.logprobs(batch)).max() < 0.5   # quantization moved it, a little
  policy.save_hf(str(tmp_path / "fresh"))   # zero adapters: the dequantized base itself
  np.testing.assert_allclose(JaxPolicy.from_hf(str(tmp_path / "fresh"), config).logprobs(batch), quantized_lp,
                             atol=1e-5)
  _randomize_adapters(policy)
  adapted = policy.logprobs(batch)
  assert np.abs(adapted - quantized_lp).max() > 1e-3
  policy.save_hf(str(tmp_path / "merged"))   # dequantized W + scale * B A
  np.testing.assert_allclose(JaxPolicy.from_hf(str(tmp_path / "merged"), config).logprobs(batch), adapted,
                             atol=1e-5)
  held = sum(v.nbytes for v in quant.quantized_weights(model).values())
  fp32 = sum(int(np.prod(v.shape)) * 4 for v in quant.quantized_weights(model).values())
  assert held < fp32 / {"int8": 3.5, "nf4": 6.5}[base_quant], (held, fp32)


@pytest.fixture(scope="module")
def trained(tiny_models, tmp_path_factory):
  from dockyard.validate import load_config_file
  config = load_config_file(os.path.join(os.path.dirname(__file__), "..", "..", "configs", "swe.py"))
  config.mesh.shape = (1, 1, 1)
  cfg = _qlora_config(config, "nf4")
  policy = JaxPolicy.from_hf(tiny_models["qwen2"], cfg)
  out = dict(cfg=cfg, policy=policy, raw=_raw(policy), batch=_batch())
  out["losses"] = [policy.train_step(out["batch"], losses.nll_loss)["loss"] for _ in range(4)]
  out["ckpt"] = str(tmp_path_factory.mktemp("qlora_ckpt"))
  policy.save(out["ckpt"])
  return out


def test_step_on_a_quantized_base_trains_adapters_only(trained):
  policy = trained["policy"]
  assert trained["losses"][-1] < trained["losses"][0] - 0.05, trained["losses"]
  opt = {".".join(map(str, k)) for k, v in nnx.to_flat_state(nnx.state(policy.optimizer.opt_state))
         if np.ndim(v.get_value()) > 0}
  assert opt and all(k.endswith(("lora_a", "lora_b")) for k in opt), sorted(opt)[:5]
  after = _raw(policy)
  assert sorted(after) == sorted(trained["raw"])
  for k, v in trained["raw"].items():
    np.testing.assert_array_equal(v, after[k], err_msg=k)
  assert all(np.abs(np.asarray(a.lora_b[...])).max() > 0 for a in lora.adapters(policy.model).values())


def test_adapter_checkpoint_loads_onto_a_quantized_base(trained, tiny_models, config):
  policy, batch = trained["policy"], trained["batch"]
  fresh = JaxPolicy.from_hf(tiny_models["qwen2"], trained["cfg"])
  fresh.restore(trained["ckpt"])
  assert fresh.step == policy.step == 4
  np.testing.assert_array_equal(fresh.logprobs(batch), policy.logprobs(batch))
  # The same adapters onto the base held in fp32: they load (base_quant is not matched), and the
  # logprobs differ only by the quantization error.
  unquantized = JaxPolicy.from_hf(tiny_models["qwen2"], _qlora_config(config, "none"))
  unquantized.restore(trained["ckpt"])
  assert np.abs(unquantized.logprobs(batch) - policy.logprobs(batch)).max() < 0.5


def test_sharded_quantized_base_matches_one_device(tiny_models, config):
  if jax.device_count() < 4:
    pytest.skip(f"needs 4 devices, JAX has {jax.device_count()}")
  batch = _batch()
  out = []
  for shape in ((1, 1, 1), (1, 2, 2)):   # embed over fsdp, heads / mlp over tensor
    cfg = _qlora_config(config, "nf4", targets=("q_proj", "down_proj"))
    cfg.mesh.shape = shape
    cfg.cluster.cpu_devices = int(np.prod(shape))
    policy = JaxPolicy.from_hf(tiny_models["qwen2"], cfg)
    _randomize_adapters(policy)
    if shape != (1, 1, 1):   # the codes follow the kernel's logical axes onto the mesh
      codes = policy.model.layers[0].mlp.gate_proj.kernel.get_raw_value()["codes"]
      assert not codes.sharding.is_fully_replicated, codes.sharding
    out.append((policy.logprobs(batch), policy.train_step(batch, losses.nll_loss)["loss"]))
  np.testing.assert_allclose(out[0][0], out[1][0], atol=2e-5)
  np.testing.assert_allclose(out[0][1], out[1][1], rtol=1e-5)
