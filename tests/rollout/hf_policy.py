"""Test helper (not product code): an HF transformers torch model as the "trainer" `Policy`.

Stands in for the JAX policy until it lands: `named_weights()` yields the state dict as NumPy in
the HF safetensors layout (tied `lm_head.weight` left out, as `save_pretrained` does), and
`logprobs()` runs the model's forward. `perturb()` makes "updated weights".
"""
from __future__ import annotations

import numpy as np
import torch
import transformers

from dockyard.policy import Policy, TrainBatch

# fp32 on CPU: vLLM and HF differ only by kernel summation order (~1e-6 measured); 1e-4 leaves room.
LOGPROB_TOL = 1e-4


class HFTorchPolicy(Policy):

  def __init__(self, model):
    self.model = model.eval()
    self._step = 0
    self.lr = 1e-2

  @classmethod
  def from_hf(cls, path, config=None):
    return cls(transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32))

  @torch.no_grad()
  def logprobs(self, batch: TrainBatch) -> np.ndarray:
    ids = torch.as_tensor(batch.input_ids, dtype=torch.long)
    mask = torch.as_tensor(batch.attention_mask, dtype=torch.long)
    logits = self.model(input_ids=ids, attention_mask=mask).logits.float() / batch.temperature
    lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    out = torch.zeros(ids.shape, dtype=torch.float64)
    out[:, 1:] = lp.double()
    return (out * mask).numpy()

  def train_step(self, batch, loss_fn):
    """One plain SGD step (lr 1e-2, or `set_lr`'s) on loss_fn(logprobs, loss_mask, extras)."""
    self.model.train()
    ids = torch.as_tensor(batch.input_ids, dtype=torch.long)
    logits = self.model(input_ids=ids, attention_mask=torch.as_tensor(batch.attention_mask)).logits / batch.temperature
    lp = torch.zeros(ids.shape)
    lp[:, 1:] = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    mask = torch.as_tensor(batch.loss_mask, dtype=torch.float32)
    extras = {k: torch.as_tensor(v) for k, v in batch.extras.items()}
    extras.setdefault("total_tokens", mask.sum())
    extras.setdefault("total_sequences", (mask.sum(1) > 0).float().sum())
    loss, metrics = loss_fn(lp, mask, extras)
    self.model.zero_grad()
    loss.backward()
    with torch.no_grad():
      for p in self.model.parameters():
        if p.grad is not None:
          p -= self.lr * p.grad
    self.model.eval()
    self._step += 1
    return {"loss": float(loss), **{k: float(v) for k, v in metrics.items()}}

  def set_lr(self, lr):
    self.lr = 1e-2 if lr is None else float(lr)

  def named_weights(self):
    tied = bool(getattr(self.model.config, "tie_word_embeddings", False))
    for name, tensor in self.model.state_dict().items():
      if tied and name == "lm_head.weight":
        continue
      yield name, tensor.detach().cpu().numpy()

  @torch.no_grad()
  def perturb(self, scale: float = 0.05, seed: int = 0) -> None:
    """Adds relative Gaussian noise to every weight: a stand-in for an optimizer step."""
    g = torch.Generator().manual_seed(seed)
    for p in self.model.parameters():
      p += scale * p.abs().mean() * torch.randn(p.shape, generator=g)
    self._step += 1

  def save(self, directory):
    self.model.save_pretrained(directory)

  def restore(self, directory):
    self.model.load_state_dict(type(self).from_hf(directory).model.state_dict())

  @property
  def step(self):
    return self._step


def batch_of(sequences) -> TrainBatch:
  """A right-padded TrainBatch of token-id sequences (loss on every token after the first)."""
  width = max(len(s) for s in sequences)
  ids = np.zeros((len(sequences), width), np.int32)
  mask = np.zeros_like(ids)
  for i, s in enumerate(sequences):
    ids[i, :len(s)] = s
    mask[i, :len(s)] = 1
  return TrainBatch(input_ids=ids, attention_mask=mask, loss_mask=mask.copy())


def hf_greedy(policy: HFTorchPolicy, prompt, max_new_tokens: int) -> list[int]:
  """The HF model's greedy continuation (EOS not special, like a length-capped vLLM request)."""
  ids = torch.tensor([prompt])
  out = policy.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                              do_sample=False, eos_token_id=None, pad_token_id=0)
  return out[0, len(prompt):].tolist()


def hf_greedy_batch(model, prompts, max_new_tokens: int, pad_id: int) -> list[list[int]]:
  """Greedy continuations of several prompts in ONE left-padded `generate` call (the attention
  mask keeps the padding out; transformers derives positions from it). EOS is not special: every
  row gets `max_new_tokens` tokens, to be cut where the engine stopped."""
  width = max(len(p) for p in prompts)
  ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
  mask = torch.zeros_like(ids)
  for i, p in enumerate(prompts):
    ids[i, width - len(p):] = torch.tensor(p)
    mask[i, width - len(p):] = 1
  with torch.no_grad():
    out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=None, pad_token_id=pad_id)
  return out[:, width:].tolist()
