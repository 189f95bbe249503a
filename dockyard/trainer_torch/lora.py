"""LoRA for the torch trainer, with peft (pinned in setup.py), on the same `config.policy.lora`.

`inject(model, cfg)` puts peft's LoRA layers into the HF model in place (`inject_adapter_in_model`:
the model stays the HF class, so FSDP2 wraps its decoder layers as before) and freezes every
parameter that is not an adapter. peft renames a wrapped projection's weight from
`...q_proj.weight` to `...q_proj.base_layer.weight`; `base_name` maps it back to the HF name the
refit name-map knows. `merged(module)` is `W + scaling * B @ A` (peft's `scaling` is
alpha / rank), gathered to the full tensor when sharded: what refit and `save_hf` send.
"""
from __future__ import annotations

import torch

from dockyard.models.lora import LoRAConfig

ADAPTER = "default"   # peft's adapter name


def inject(model: torch.nn.Module, cfg: LoRAConfig) -> torch.nn.Module:
  if cfg.base_quant != "none":   # dockyard.validate refuses this first; a direct caller gets it here
    raise ValueError(f"policy.lora.base_quant={cfg.base_quant!r}: a quantized base (QLoRA) is the JAX "
                     f"trainer's; the torch backend's would be bitsandbytes, which has no CPU path: "
                     f"use policy.backend='jax' or base_quant='none'")
  import peft
  peft_config = peft.LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                                target_modules=list(cfg.targets), bias="none")
  model = peft.inject_adapter_in_model(peft_config, model, adapter_name=ADAPTER)
  for name, p in model.named_parameters():
    p.requires_grad_(is_adapter(name))
  return model


def is_adapter(param_name: str) -> bool:
  return ".lora_A." in param_name or ".lora_B." in param_name


def base_name(param_name: str) -> str:
  """peft's name of a wrapped weight -> the HF name ('...q_proj.base_layer.weight' -> '...q_proj.weight')."""
  return param_name.replace(".base_layer.", ".")


def lora_modules(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
  """HF weight name ('model.layers.0.self_attn.q_proj.weight') -> its peft LoRA layer."""
  out = {}
  for name, module in model.named_modules():
    if hasattr(module, "lora_A") and ADAPTER in getattr(module, "lora_A", {}):
      out[f"{name}.weight"] = module
  return out


def _full(t: torch.Tensor) -> torch.Tensor:
  return t.full_tensor() if hasattr(t, "full_tensor") else t


@torch.no_grad()
def merged(module: torch.nn.Module) -> torch.Tensor:
  """`W + scaling * B @ A` of one peft LoRA layer, full (unsharded), in W's dtype. A gather is a
  collective: under torchrun every rank must call this."""
  w = _full(module.base_layer.weight.detach())
  a = _full(module.lora_A[ADAPTER].weight.detach()).to(torch.float32)
  b = _full(module.lora_B[ADAPTER].weight.detach()).to(torch.float32)
  return (w.to(torch.float32) + module.scaling[ADAPTER] * (b @ a)).to(w.dtype)


@torch.no_grad()
def factors(module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
  """(lora_A [rank, in], lora_B [out, rank]), full tensors (a collective when sharded)."""
  return (_full(module.lora_A[ADAPTER].weight.detach()).clone(),
          _full(module.lora_B[ADAPTER].weight.detach()).clone())
