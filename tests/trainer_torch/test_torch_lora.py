"""LoRA on the torch trainer (peft): merge == adapter forward, frozen base, AdamW state for the
adapters alone, a GRPO step that lowers its loss, adapter-only checkpoints onto the base."""
import os

import numpy as np
import pytest
import torch

import torch_common
from dockyard.models import lora as lora_cfg
from dockyard.trainer_torch import loss as losses
from dockyard.trainer_torch import lora
from dockyard.trainer_torch.policy import TorchPolicy


def _lora(**kw):
  cfg = torch_common.make_config(lr=1e-2, warmup_steps=0)
  cfg.optim.end_lr_factor = 1.0
  cfg.policy.lora.enabled = True
  cfg.policy.lora.rank = 4
  cfg.policy.lora.alpha = 8.0
  for k, v in kw.items():
    cfg.policy.lora[k] = v
  return cfg


def _base(policy):
  def full(p):   # the root's parameters stay unsharded after a forward (FSDP2)
    return p.full_tensor() if hasattr(p, "full_tensor") else p
  return {lora.base_name(n): full(p.detach()).clone() for n, p in policy.model.named_parameters()
          if not lora.is_adapter(n)}


@torch.no_grad()
def _randomize_adapters(policy, seed=0):
  """Non-zero B (a fresh adapter is an exact no-op), so the merge has something to merge."""
  g = torch.Generator().manual_seed(seed)
  for module in lora.lora_modules(policy.model).values():
    b = module.lora_B[lora.ADAPTER].weight
    local = b.to_local() if hasattr(b, "to_local") else b
    local.copy_(torch.randn(local.shape, generator=g) * 0.05)


@pytest.fixture(scope="module")
def trained(model_path, tmp_path_factory):
  torch.set_num_threads(1)
  cfg = _lora()
  policy = TorchPolicy.from_hf(model_path, cfg)
  batch = torch_common.make_batch()
  batch = torch_common.with_prev(batch, policy.logprobs(batch))
  out = dict(cfg=cfg, policy=policy, batch=batch, base=_base(policy),
             trainable=[n for n, p in policy.model.named_parameters() if p.requires_grad])
  pg = losses.make_pg_loss(torch_common.loss_config(cfg))
  out["losses"] = [policy.train_step(batch, pg)["loss"] for _ in range(3)]
  out["ckpt"] = str(tmp_path_factory.mktemp("torch_lora_ckpt"))
  policy.save(out["ckpt"])
  return out


def test_grpo_step_trains_adapters_only_and_lowers_the_loss(trained):
  policy = trained["policy"]
  assert trained["trainable"] and all(lora.is_adapter(n) for n in trained["trainable"])
  assert len(trained["trainable"]) == 2 * 2 * len(lora_cfg.TARGETS)   # A and B, 2 layers, 7 projections
  adapter_params = {id(p) for n, p in policy.model.named_parameters() if lora.is_adapter(n)}
  state_params = {id(p) for p in policy.optimizer.state}
  assert state_params and state_params <= adapter_params   # AdamW moments for adapters alone
  assert trained["losses"][-1] < trained["losses"][0], trained["losses"]
  after = _base(policy)
  for name, value in trained["base"].items():
    torch.testing.assert_close(after[name], value, rtol=0, atol=0, msg=name)


def test_merged_export_equals_the_adapter_forward(trained, model_path, tmp_path):
  policy, batch = trained["policy"], trained["batch"]
  adapted = policy.logprobs(batch)
  plain = TorchPolicy.from_hf(model_path, torch_common.make_config())
  assert np.abs(adapted - plain.logprobs(batch)).max() > 1e-3   # the adapters matter
  policy.save_hf(str(tmp_path / "merged"))
  merged = TorchPolicy.from_hf(str(tmp_path / "merged"), torch_common.make_config())
  np.testing.assert_allclose(merged.logprobs(batch), adapted, atol=1e-5)
  touched = dict(policy.named_weights(touched_only=True))
  full = dict(merged.named_weights())
  assert len(touched) == 2 * len(lora_cfg.TARGETS)
  for name, arr in touched.items():
    np.testing.assert_allclose(arr, full[name], atol=1e-6, err_msg=name)


def test_adapter_checkpoint_round_trips_onto_the_base(trained, model_path):
  policy, batch, ckpt = trained["policy"], trained["batch"], trained["ckpt"]
  import torch.distributed.checkpoint as dcp
  saved = dcp.FileSystemReader(os.path.join(ckpt, "3")).read_metadata().state_dict_metadata
  model_keys = sorted(k.removeprefix("model.") for k in saved if k.startswith("model."))
  assert model_keys == sorted(trained["trainable"])   # the adapters, no base (not the tied head either)
  fresh = TorchPolicy.from_hf(model_path, trained["cfg"])
  fresh.restore(ckpt)
  assert fresh.step == 3
  np.testing.assert_array_equal(fresh.logprobs(batch), policy.logprobs(batch))
  with pytest.raises(ValueError, match="policy.lora.rank"):
    TorchPolicy.from_hf(model_path, _lora(rank=8)).restore(ckpt)


def test_peft_adapter_directory_loads_into_peft(trained, model_path, tmp_path):
  """`save_adapter` writes what vLLM and peft load: the same forward as the policy's."""
  import peft
  import transformers
  policy, batch = trained["policy"], trained["batch"]
  policy.save_adapter(str(tmp_path / "adapter"))
  base = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
  model = peft.PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
  ids = torch.as_tensor(batch.input_ids[:2], dtype=torch.long)
  with torch.no_grad():
    logits = model(input_ids=ids).logits
  from dockyard.trainer_torch.policy import token_logprobs
  ref = token_logprobs(logits, ids).numpy()
  np.testing.assert_allclose(policy.logprobs(batch)[:2][:, :ids.shape[1]] * batch.attention_mask[:2],
                             ref * batch.attention_mask[:2], atol=1e-5)
