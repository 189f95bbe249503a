"""Qwen3-Next through the torch trainer (transformers' Qwen3NextForCausalLM under FSDP2, its Gated
DeltaNet layers on transformers' PyTorch fallback of the delta rule): the same logprobs as the
JAX trainer on right-padded rows, and after one GRPO step (router losses on) the same loss,
metrics and weights, every tensor through each side's name-map path."""
import numpy as np
import pytest

import torch_common


@pytest.fixture(scope="module")
def next_path(tmp_path_factory):
  """A tiny random Qwen3-Next: layer 0 Gated DeltaNet, layer 1 gated full attention, both sparse
  blocks (8 experts, top-2, + a shared expert), untied head; routers scaled up (no near-ties
  that rounding could break differently in the two backends), slow decay so the recurrent state
  matters, zero-centred norms perturbed."""
  import torch
  import transformers

  from dockyard.models.tiny import make_hf_config
  cfg = make_hf_config({"family": "qwen3_next", "tie_word_embeddings": False})
  torch.manual_seed(0)
  model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("mlp.gate.weight"):
        p.mul_(30.0)
      elif "norm" in name:
        p.normal_(0.0, 0.5)
      elif name.endswith("A_log"):
        p.copy_(torch.empty_like(p).uniform_(0.01, 0.3).log())
  path = str(tmp_path_factory.mktemp("qwen3_next"))
  model.save_pretrained(path)
  return path


def test_qwen3_next_torch_matches_jax(next_path):
  import jax

  from dockyard.trainer_jax.policy import JaxPolicy
  from dockyard.trainer_torch.policy import TorchPolicy
  cfg = torch_common.make_config(micro_batch_size=4, warmup_steps=0)
  cfg.policy.moe = dict(aux_loss_coef=0.1, z_loss_coef=0.01, bias_update_rate=0.0)
  torch_policy = TorchPolicy.from_hf(next_path, cfg)   # its name check: HF's parameters = the name map
  jax_policy = JaxPolicy.from_hf(next_path, cfg, devices=jax.devices()[:1])
  assert torch_policy.model_config.linear_layers == (0,)
  batch = torch_common.make_batch(seed=5, t=80, vocab=1024)   # rows longer than one 64-token chunk
  lp_t, lp_j = torch_policy.logprobs(batch), jax_policy.logprobs(batch)
  print(f"max |logprob torch - jax| = {np.abs(lp_t - lp_j).max():.2e}")
  np.testing.assert_allclose(lp_t, lp_j, rtol=0, atol=1e-4)

  _, t = torch_common.pg_step_on_both(torch_policy, jax_policy, cfg, batch, lp_t,
                                      ("loss", "pg_loss", "grad_norm", "moe_aux_loss", "moe_z_loss"))
  assert "model.layers.0.linear_attn.conv1d.weight" in t
