"""Configs select a model family by name; validation rejects what a family cannot use, naming the key
(no model loads: the family comes from `policy.tiny` or a local config.json)."""
import json

from configs import swe
from dockyard.validate import validate
from tests.config_overrides import rejects


def _moe(devices=8, shape=(1, 2, 4, 1), arg="moe"):
  config = swe.get_config(arg)
  config.cluster.cpu_devices = devices
  config.mesh.shape = shape
  return config


def test_the_moe_variant_validates_with_expert_parallelism():
  config = _moe()
  validate(config)
  assert config.policy.tiny.family == "qwen3_moe" and "expert" in config.mesh.axes
  assert dict(config.mesh.rules)["expert"] == "expert"


def test_family_mismatches_name_their_key(tmp_path):
  dense = swe.get_config("tiny")
  dense.cluster.cpu_devices = 8
  dense.mesh.axes, dense.mesh.shape = ("data", "fsdp", "expert", "tensor"), (1, 4, 2, 1)
  rejects(dense, "mesh.shape", "dense model")
  dense = swe.get_config("tiny")
  dense.policy.moe = dict(aux_loss_coef=0.1)
  rejects(dense, "policy.moe.aux_loss_coef", "dense model")
  rejects(_moe(6, (1, 2, 3, 1)), "mesh.shape", "does not divide the model's 8 experts")
  # The torch trainer trains Qwen3-MoE, but without expert parallelism or the balancing bias.
  rejects(_moe(arg="moe,torch"), "mesh.shape", "no expert parallelism")
  torch_moe = _moe(shape=(1, 8, 1, 1), arg="moe,torch")
  torch_moe.policy.moe.update(aux_loss_coef=0.01, z_loss_coef=0.001)
  validate(torch_moe)
  torch_moe.policy.moe.bias_update_rate = 1e-3
  rejects(torch_moe, "policy.moe.bias_update_rate", "JAX-only")
  unrouted = _moe(2, (1, 1, 2, 1))
  unrouted.mesh.rules = tuple(r for r in unrouted.mesh.rules if r[0] != "expert")
  rejects(unrouted, "mesh.rules", "would not be split")
  negative = _moe()
  negative.policy.moe.z_loss_coef = -1.0
  rejects(negative, "policy.moe.z_loss_coef", ">= 0")
  unknown = swe.get_config("tiny")
  unknown.policy.tiny.family = "qwen9"
  rejects(unknown, "policy.tiny.family", "unknown family")
  # A local checkpoint's config.json decides the family (a dense Qwen3 here) ...
  hf = dict(model_type="qwen3", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1)
  (tmp_path / "config.json").write_text(json.dumps(hf))
  local = _moe()
  local.policy.model_name_or_path = str(tmp_path)
  rejects(local, "mesh.shape", "'qwen3' is a dense model")
  # ... and one the decoder cannot build is refused before anything loads.
  (tmp_path / "config.json").write_text(json.dumps({**hf, "model_type": "qwen3_moe", "num_experts": 0}))
  rejects(local, "policy.model_name_or_path", "num_experts")
