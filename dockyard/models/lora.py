"""LoRA settings shared by both trainers, the validator and refit (`config.policy.lora`).

A LoRA adapter on a projection W (HF layout [out, in]) adds `scale * B @ A` with A [rank, in],
B [out, rank] and `scale = alpha / rank`; the base W stays frozen and only A and B train. The
JAX trainer (`dockyard.trainer_jax.lora`) and the torch trainer (peft, `dockyard.trainer_torch.lora`)
read the same section; refit merges the adapters into the touched projections or ships them
as a PEFT adapter directory to vLLM (`dockyard.refit.synchronizer`). NumPy and stdlib only, so
the validator can use it before any framework loads (safetensors is imported only to write).
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import numpy as np

# The projections an adapter may wrap, by their HF module names (the JAX decoder uses the same).
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
TARGETS = ATTENTION + MLP
KEYS = ("enabled", "rank", "alpha", "dropout", "targets", "base_quant")
# How the frozen base is held (JAX trainer, `dockyard.trainer_jax.quant`): as loaded, int8 per
# output channel, or QLoRA's 4-bit NormalFloat in blocks of 64.
BASE_QUANTS = ("none", "int8", "nf4")


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
  rank: int
  alpha: float
  dropout: float
  targets: tuple[str, ...]
  base_quant: str = "none"

  @property
  def scale(self) -> float:
    return self.alpha / self.rank

  @classmethod
  def from_config(cls, config: Any) -> "LoRAConfig | None":
    """`config.policy.lora` as a LoRAConfig, or None when it is absent or disabled. Raises
    ValueError starting with the offending key ('policy.lora.<key>: ...')."""
    policy = config["policy"] if "policy" in config else None
    if policy is None or "lora" not in policy:
      return None
    section = policy["lora"]
    unknown = sorted(set(section.keys()) - set(KEYS))
    if unknown:
      raise ValueError(f"policy.lora: unknown keys {unknown} (known: {list(KEYS)})")
    base_quant = section.get("base_quant", "none")
    if base_quant not in BASE_QUANTS:
      raise ValueError(f"policy.lora.base_quant: must be one of {list(BASE_QUANTS)}, got {base_quant!r}")
    if not section["enabled"]:
      if base_quant != "none":
        raise ValueError(f"policy.lora.base_quant: {base_quant!r} quantizes the frozen base under "
                         f"LoRA; full fine-tuning trains the base, which stays as loaded: set "
                         f"policy.lora.enabled=True or base_quant='none'")
      return None
    rank, alpha, dropout = section["rank"], section["alpha"], section["dropout"]
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
      raise ValueError(f"policy.lora.rank: must be an integer >= 1, got {rank!r}")
    if not (isinstance(alpha, (int, float)) and alpha > 0):
      raise ValueError(f"policy.lora.alpha: must be a number > 0, got {alpha!r}")
    if not (isinstance(dropout, (int, float)) and 0 <= dropout < 1):
      raise ValueError(f"policy.lora.dropout: must be in [0, 1), got {dropout!r}")
    targets = section["targets"]
    targets = (targets,) if isinstance(targets, str) else tuple(targets)
    bad = [t for t in targets if t not in TARGETS]
    if not targets or bad or len(set(targets)) != len(targets):
      raise ValueError(f"policy.lora.targets: must name distinct projections of {list(TARGETS)}, "
                       f"got {list(targets)}")
    return cls(int(rank), float(alpha), float(dropout), targets, str(base_quant))

  def to_json(self) -> dict:
    # base_quant is recorded, not matched on restore: adapters trained on a quantized base load
    # onto the same base held otherwise (as QLoRA adapters are served on the fp16 base).
    return dict(rank=self.rank, alpha=self.alpha, dropout=self.dropout, targets=list(self.targets),
                base_quant=self.base_quant)


def check_matches(saved: dict | None, current: LoRAConfig | None, where: str) -> None:
  """A checkpoint's LoRA record (None: saved without LoRA) against the policy's LoRA config (None:
  off): both off, or an adapter checkpoint onto the same shapes and scale; says which key differs."""
  if (saved is None) != (current is None):
    raise ValueError(f"policy.lora.enabled: the checkpoint in {where!r} was saved "
                     f"{'without' if saved is None else 'with'} LoRA, the policy has it "
                     f"{'on' if current is not None else 'off'}")
  if saved is None:
    return
  now = current.to_json()
  for key in ("rank", "alpha", "targets"):
    if saved.get(key) != now[key]:
      raise ValueError(f"policy.lora.{key}: the adapter checkpoint {where!r} was saved with "
                       f"{key}={saved.get(key)!r}, the policy has {now[key]!r}")


ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"


def write_peft_adapter(path: str, tensors: Mapping[str, np.ndarray], cfg: LoRAConfig) -> int:
  """Writes a PEFT adapter directory (adapter_config.json + adapter_model.safetensors), the
  format vLLM's `LoRARequest` and `peft.PeftModel.from_pretrained` load; `tensors` are named as
  `name_map.peft_names` gives. Returns the bytes of the tensors. The file is written under a
  temporary name and renamed, so a reader never sees half of it."""
  from safetensors.numpy import save_file
  os.makedirs(path, exist_ok=True)
  config = dict(peft_type="LORA", task_type="CAUSAL_LM", r=cfg.rank, lora_alpha=cfg.alpha,
                lora_dropout=cfg.dropout, target_modules=list(cfg.targets), bias="none",
                fan_in_fan_out=False, use_rslora=False, use_dora=False, modules_to_save=None,
                base_model_name_or_path=None, inference_mode=True)
  with open(os.path.join(path, ADAPTER_CONFIG), "w") as f:
    json.dump(config, f, indent=2)
  tmp = os.path.join(path, ADAPTER_WEIGHTS + ".tmp")
  arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
  save_file(arrays, tmp, metadata={"format": "pt"})
  os.replace(tmp, os.path.join(path, ADAPTER_WEIGHTS))
  return sum(a.nbytes for a in arrays.values())
