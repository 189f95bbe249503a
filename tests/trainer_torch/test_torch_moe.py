"""Qwen3-MoE through the torch trainer (transformers' Qwen3MoeForCausalLM under FSDP2): the same
logprobs as the JAX trainer on right-padded rows, and after one GRPO step with both router losses
on, the same loss, router metrics and weights (HF layout, every expert, through each side's
name-map path), also on packed rows; the router losses alone move what feeds a router and nothing else; the balancing
bias is refused."""
import numpy as np
import pytest

import torch_common

AUX, Z = 0.1, 0.01   # router loss weights (policy.moe): large enough to matter in the step


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory):
  """A tiny random Qwen3-MoE: layers 0 and 1 sparse (6 experts, top-3, unnormalised weights),
  layer 2 dense (`mlp_only_layers`), untied head. Router weights are scaled up as in
  tests/trainer_jax/test_jax_moe.py: random init leaves near-ties in the top-k choice, which
  float rounding could then break differently in the two backends."""
  import torch
  import transformers

  from dockyard.models.tiny import make_hf_config
  cfg = make_hf_config({"family": "qwen3_moe", "num_hidden_layers": 3, "tie_word_embeddings": False,
                        "num_experts": 6, "num_experts_per_tok": 3, "norm_topk_prob": False})
  cfg.mlp_only_layers = [2]
  torch.manual_seed(0)
  model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("mlp.gate.weight"):
        p.mul_(30.0)
  path = str(tmp_path_factory.mktemp("qwen3_moe"))
  model.save_pretrained(path)
  return path


def _config(**moe):
  cfg = torch_common.make_config(micro_batch_size=4, warmup_steps=0)
  cfg.policy.moe = {**dict(aux_loss_coef=AUX, z_loss_coef=Z, bias_update_rate=0.0), **moe}
  return cfg


def test_qwen3_moe_torch_matches_jax(moe_path):
  import jax

  from dockyard.trainer_jax.policy import JaxPolicy
  from dockyard.trainer_torch.policy import TorchPolicy
  cfg = _config()
  torch_policy = TorchPolicy.from_hf(moe_path, cfg)   # its name check: fused experts = the name-map
  jax_policy = JaxPolicy.from_hf(moe_path, cfg, devices=jax.devices()[:1])
  assert torch_policy.model_config.moe_layers == (0, 1)
  # 7 right-padded rows in micro-batches of 4: the second holds a padding row, which must not
  # count in the router statistics (JAX pads with an empty row, torch with a one-token one).
  batch = torch_common.make_batch(seed=5, t=40, vocab=1024)
  lp_t, lp_j = torch_policy.logprobs(batch), jax_policy.logprobs(batch)
  print(f"max |logprob torch - jax| = {np.abs(lp_t - lp_j).max():.2e}")
  np.testing.assert_allclose(lp_t, lp_j, rtol=0, atol=1e-4)

  m_t, t = torch_common.pg_step_on_both(
      torch_policy, jax_policy, cfg, batch, lp_t,
      ("loss", "pg_loss", "grad_norm", "moe_aux_loss", "moe_z_loss", "moe_load_max", "moe_load_min"))
  assert m_t["moe_aux_loss"] > 0.5 and m_t["moe_z_loss"] > 1.0   # real terms (per micro-batch mean)
  assert "model.layers.1.mlp.experts.5.up_proj.weight" in t
  assert "model.layers.2.mlp.up_proj.weight" in t   # the dense layer keeps its MLP names


def test_qwen3_moe_packed_step_matches_jax(moe_path):
  """Packed rows (2 rows of <= 64 tokens a micro-batch, the same first-fit packing on both sides):
  the router statistics count each row's segments and never its padding tail."""
  import jax

  from dockyard.trainer_jax import loss as jax_loss
  from dockyard.trainer_jax.policy import JaxPolicy
  from dockyard.trainer_torch import loss as torch_loss
  from dockyard.trainer_torch.policy import TorchPolicy
  cfg = _config()
  cfg.optim.micro_batch_size = 2
  cfg.policy.packing_row_tokens = 64
  torch_policy = TorchPolicy.from_hf(moe_path, cfg)
  jax_policy = JaxPolicy.from_hf(moe_path, cfg, devices=jax.devices()[:1])
  batch = torch_common.make_batch(seed=5, t=40, vocab=1024)
  batch = torch_common.with_prev(batch, torch_policy.logprobs(batch))
  lc = torch_common.loss_config(cfg)
  m_t = torch_policy.train_step(batch, torch_loss.make_pg_loss(lc))
  m_j = jax_policy.train_step(batch, jax_loss.make_pg_loss(lc))
  for k in ("loss", "grad_norm", "moe_aux_loss", "moe_z_loss", "moe_load_max", "moe_load_min"):
    assert m_t[k] == pytest.approx(m_j[k], rel=1e-4, abs=1e-6), k


def test_router_losses_alone_move_what_feeds_a_router(moe_path):
  """A task loss of zero: the step's loss is the router terms, and only the routers and what
  feeds them (layer 0's experts feed layer 1's router) move; layer 1's experts (no router reads
  their output: layer 2 is dense), the dense MLP, the final norm and the head stay put."""
  import torch

  from dockyard.trainer_torch.policy import TorchPolicy
  with pytest.raises(ValueError, match="bias_update_rate"):   # refused before any model loads
    TorchPolicy.from_hf(moe_path, _config(bias_update_rate=1e-3))
  cfg = _config()
  cfg.optim.weight_decay = 0.0   # so that a zero gradient leaves a weight exactly as it was
  policy = TorchPolicy.from_hf(moe_path, cfg)
  before = dict(policy.named_weights())
  batch = torch_common.make_batch(seed=2, b=4, t=32, vocab=1024)   # one micro-batch
  # The routing of the step's forward pass (same weights, real tokens only): its expert load.
  policy.model.train()
  with torch.no_grad():
    _, router = policy._forward(batch.input_ids, batch.attention_mask)
  load = policy.router_loss.terms(router, batch.attention_mask).load.numpy()
  assert load.sum() == batch.attention_mask.sum() * 3 * 2   # top-3 in each of two sparse layers
  share = load / load.mean(-1, keepdims=True)
  zero = lambda lp, m, e: (0.0 * (lp * m).sum(), {})   # noqa: E731
  out = policy.train_step(batch, zero)
  assert out["loss"] == pytest.approx(AUX * out["moe_aux_loss"] + Z * out["moe_z_loss"], rel=1e-6)
  assert out["grad_norm"] > 0
  assert out["moe_load_max"] == pytest.approx(share.max()) and out["moe_load_min"] == pytest.approx(share.min())
  assert share.max() > 1.0 > share.min()
  after = dict(policy.named_weights())
  moved = {n for n in before if np.abs(after[n] - before[n]).max() > 0}
  assert {"model.layers.0.mlp.gate.weight", "model.layers.1.mlp.gate.weight"} <= moved
  assert any(n.startswith("model.layers.0.mlp.experts.") for n in moved)
  for n in ("model.layers.1.mlp.experts.0.gate_proj.weight", "model.layers.1.mlp.experts.3.down_proj.weight",
            "model.layers.2.mlp.down_proj.weight", "model.norm.weight", "lm_head.weight"):
    assert n not in moved, n

