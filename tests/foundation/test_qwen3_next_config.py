"""A config selects Qwen3-Next by name (`policy.tiny.family` or a local config.json); validation
rejects what its Gated DeltaNet layers cannot use, naming the key (docs/qwen3_next.md)."""
import json

from configs import swe
from dockyard.validate import validate
from tests.config_overrides import rejects


def _next(arg="tiny"):
  config = swe.get_config(arg)
  config.policy.tiny.family = "qwen3_next"
  return config


def test_qwen3_next_validates_on_both_backends():
  for arg in ("tiny", "tiny,torch"):
    validate(_next(arg))
  moe = _next()
  moe.policy.moe = dict(aux_loss_coef=0.01, z_loss_coef=0.001)   # the tiny default has experts
  validate(moe)


def test_what_gated_deltanet_cannot_use_names_its_key(tmp_path):
  packed = _next()
  packed.policy.packing_row_tokens = 1024
  rejects(packed, "policy.packing_row_tokens", "carry their recurrent state")
  cp = _next()
  cp.cluster.cpu_devices = 2
  cp.mesh.axes, cp.mesh.shape = ("data", "fsdp", "tensor", "sequence"), (1, 1, 1, 2)
  rejects(cp, "mesh.shape", "context parallelism is not implemented for qwen3_next")
  lora = _next()
  lora.policy.lora.enabled = True
  rejects(lora, "policy.lora.enabled", "not implemented for qwen3_next")
  # A dense Qwen3-Next (num_experts 0) has no router to weigh.
  dense = _next()
  dense.policy.tiny.num_experts = 0
  dense.policy.moe = dict(aux_loss_coef=0.1)
  rejects(dense, "policy.moe.aux_loss_coef", "dense model")
  # A local checkpoint's config.json decides the family the same way.
  hf = dict(model_type="qwen3_next", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_experts=0,
            linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16)
  (tmp_path / "config.json").write_text(json.dumps(hf))
  local = swe.get_config("tiny")
  local.policy.model_name_or_path = str(tmp_path)
  local.policy.packing_row_tokens = 1024
  rejects(local, "policy.packing_row_tokens", "qwen3_next")


def test_the_canarys_mean_bound_comes_from_the_config():
  """refit.canary.max_mean_abs_logprob_delta (what a bf16-only engine such as qwen3_next's on CPU
  needs, docs/qwen3_next.md): 0 leaves the max bound alone; > 0 reaches the canary; < 0 refused."""
  from dockyard.refit.synchronizer import make_canary
  config = _next()
  assert make_canary(config.refit.canary, 1000).max_mean_abs_logprob_delta is None
  config.refit.canary.max_mean_abs_logprob_delta, config.refit.canary.max_abs_logprob_delta = 0.05, 2.0
  canary = make_canary(config.refit.canary, 1000)
  assert (canary.max_mean_abs_logprob_delta, canary.max_abs_logprob_delta) == (0.05, 2.0)
  assert canary.probe_ids.max() < 1000
  config.refit.canary.enabled = False
  assert make_canary(config.refit.canary, 1000) is None
  bad = _next()
  bad.refit.canary.max_mean_abs_logprob_delta = -1.0
  rejects(bad, "refit.canary.max_mean_abs_logprob_delta", ">= 0")
