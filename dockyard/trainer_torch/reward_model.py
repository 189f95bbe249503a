"""`TorchRewardModel`: the `dockyard.rm.model.RewardModel` seam on transformers.

The model is `AutoModelForSequenceClassification` with num_labels=1: its base decoder
(`base_model`) and its `score` Linear(hidden, 1, bias=False) are the head, and its
`save_pretrained` writes the layout `rm.model` names. Its own forward is not used: it pools at
the rightmost token that is not `pad_token_id`, which skips a final EOS when pad == EOS; here the
base model's last hidden states are read at `rm.model.last_token_index` (the last real token) and
the `score` layer applied to them, as the JAX backend does. One device (CPU or one GPU), fp32, no
micro-batching, no LoRA. A fresh head (loading a causal LM) is transformers' own init, seeded by
config.run.seed: normal(0, initializer_range).
"""
from __future__ import annotations

import os
import shutil
from typing import Any

import numpy as np
import torch

from dockyard.policy import TrainBatch
from dockyard.rm.model import RewardLossFn, RewardModel, last_token_index

# The tokenizer's files, copied next to the weights (the config is save_pretrained's own).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


class TorchRewardModel(RewardModel):

  def __init__(self, model, optim, source_dir: str):
    self.model, self.source_dir = model, source_dir
    self.device = next(model.parameters()).device
    self.optimizer = None
    if optim is not None:
      self.max_grad_norm = float(optim.max_grad_norm)
      self.optimizer = torch.optim.AdamW(model.parameters(), lr=float(optim.lr),
                                         weight_decay=float(optim.weight_decay))

  @classmethod
  def from_hf(cls, path: str, config: Any, trainable: bool = True) -> "TorchRewardModel":
    import transformers
    torch.manual_seed(int(config.run.seed))
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=1, dtype=torch.float32)
    if torch.cuda.is_available():
      model = model.cuda()
    return cls(model, config.optim if trainable else None, path)

  def _forward(self, batch: TrainBatch) -> torch.Tensor:
    last = torch.as_tensor(last_token_index(batch), dtype=torch.long, device=self.device)
    ids = torch.as_tensor(np.asarray(batch.input_ids), dtype=torch.long, device=self.device)
    mask = torch.as_tensor(np.asarray(batch.attention_mask), dtype=torch.long, device=self.device)
    hidden = self.model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
    pooled = hidden[torch.arange(ids.shape[0], device=self.device), last]
    return self.model.score(pooled.to(self.model.score.weight.dtype))[:, 0].float()

  def rewards(self, batch: TrainBatch) -> np.ndarray:
    self.model.eval()
    with torch.no_grad():
      return self._forward(batch).cpu().numpy().astype(np.float32)

  def train_step(self, batch: TrainBatch, loss_fn: RewardLossFn) -> dict[str, float]:
    if self.optimizer is None:
      raise RuntimeError("this reward model was loaded for scoring (trainable=False)")
    self.model.train()
    extras = {k: torch.as_tensor(np.asarray(v), device=self.device) for k, v in batch.extras.items()}
    loss, metrics = loss_fn(self._forward(batch), extras)
    self.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
    self.optimizer.step()
    return {**{k: float(v) for k, v in metrics.items()}, "grad_norm": float(grad_norm)}

  def save_hf(self, path: str) -> None:
    os.makedirs(path, exist_ok=True)
    self.model.save_pretrained(path, safe_serialization=True)
    for name in TOKENIZER_FILES:
      src = os.path.join(self.source_dir, name)
      if os.path.exists(src) and os.path.abspath(self.source_dir) != os.path.abspath(path):
        shutil.copy(src, os.path.join(path, name))
