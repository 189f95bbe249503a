"""`config.policy.lora` and `config.refit.lora_mode`: bad values fail in `validate`, naming the key;
the PEFT layout of the name-map's adapter conversion."""
import numpy as np
import pytest

from configs import dpo, swe
from dockyard import validate
from dockyard.models import lora, name_map
from dockyard.models.model_config import ModelConfig


def _config(**lora_kw):
  config = swe.get_config("tiny")
  config.policy.lora.enabled = True
  for k, v in lora_kw.items():
    config.policy.lora[k] = v
  return config


def test_defaults_validate_and_enabling_gives_the_section():
  validate.validate(swe.get_config("tiny"))
  assert lora.LoRAConfig.from_config(swe.get_config("tiny")) is None   # off by default
  cfg = lora.LoRAConfig.from_config(_config(rank=4, alpha=8.0))
  assert (cfg.rank, cfg.scale, cfg.targets) == (4, 2.0, lora.TARGETS)
  validate.validate(_config())
  preference = dpo.get_config("tiny")   # the preference runs share the policy section
  preference.policy.lora.enabled = True
  validate.validate(preference)


@pytest.mark.parametrize("key, value, msg", [
    ("rank", 0, "integer >= 1"),
    ("alpha", 0.0, "> 0"),
    ("dropout", 1.0, r"\[0, 1\)"),
    ("targets", ("q_proj", "lm_head"), "distinct projections"),
    ("targets", (), "distinct projections"),
])
def test_bad_lora_values_name_their_key(key, value, msg):
  with pytest.raises(validate.ConfigError, match=f"config.policy.lora.{key}: .*{msg}"):
    validate.validate(_config(**{key: value}))


def test_refit_lora_mode_is_checked():
  config = _config()
  config.refit.lora_mode = "delta"
  with pytest.raises(validate.ConfigError, match="config.refit.lora_mode: must be 'merge' or 'adapter'"):
    validate.validate(config)
  config = swe.get_config("tiny")
  config.refit.lora_mode = "adapter"
  with pytest.raises(validate.ConfigError, match="config.refit.lora_mode: .*policy.lora.enabled=True"):
    validate.validate(config)
  config = _config()
  config.refit.lora_mode = "adapter"
  validate.validate(config)


def test_base_quant_refusals_name_their_key():
  for value in ("int8", "nf4"):
    validate.validate(_config(base_quant=value))
    assert lora.LoRAConfig.from_config(_config(base_quant=value)).base_quant == value
  with pytest.raises(validate.ConfigError, match="config.policy.lora.base_quant: must be one of"):
    validate.validate(_config(base_quant="fp8"))
  full = swe.get_config("tiny")   # full fine-tuning trains the base: nothing to quantize
  full.policy.lora.base_quant = "nf4"
  with pytest.raises(validate.ConfigError, match="config.policy.lora.base_quant: .*policy.lora.enabled=True"):
    validate.validate(full)
  torch_cfg = swe.get_config("tiny,torch")
  torch_cfg.policy.lora.update(enabled=True, base_quant="int8")
  with pytest.raises(validate.ConfigError, match="config.policy.lora.base_quant: .*bitsandbytes.*no CPU path"):
    validate.validate(torch_cfg)
  adapter = _config(base_quant="nf4")   # vLLM would serve the adapters on the unquantized base
  adapter.refit.lora_mode = "adapter"
  with pytest.raises(validate.ConfigError, match="config.refit.lora_mode: .*base_quant='nf4'.*'merge'"):
    validate.validate(adapter)


def test_peft_layout_of_the_adapter_factors():
  """NNX a [*in dims, r] / b [r, *out dims] -> PEFT A [r, in] / B [out, r] such that B @ A is the
  HF layout of the NNX delta a . b, for each kernel shape the decoder has."""
  c = ModelConfig(family="llama", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=1,
                  num_heads=4, num_kv_heads=2, head_dim=8, rms_norm_eps=1e-6, rope_theta=1e4,
                  tie_word_embeddings=True)
  entries = {e.nnx.split(".")[-2]: e for e in name_map.lora_entries(c, lora.TARGETS)}
  assert sorted(entries) == sorted(lora.TARGETS)
  rng = np.random.default_rng(0)
  shapes = {"q_proj": ((32,), (4, 8)), "k_proj": ((32,), (2, 8)), "o_proj": ((4, 8), (32,)),
            "down_proj": ((48,), (32,))}
  for name, (din, dout) in shapes.items():
    a, b = rng.normal(size=din + (3,)), rng.normal(size=(3,) + dout)
    big_a, big_b = name_map.adapter_to_peft(a, b)
    assert big_a.shape == (3, int(np.prod(din))) and big_b.shape == (int(np.prod(dout)), 3)
    delta_nnx = np.tensordot(a, b, axes=1)
    np.testing.assert_allclose(big_b @ big_a, name_map.nnx_to_hf_array(entries[name], delta_nnx), atol=1e-12)
  assert name_map.peft_names(entries["q_proj"]) == (
      "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
      "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight")
