"""The `RewardModel` seam: a decoder with a scalar score head, trained on preference pairs.

Implemented by `dockyard.trainer_jax.reward_model` (the Flax NNX decoder of the policy trainer +
a [1, hidden] head) and `dockyard.trainer_torch.reward_model` (transformers'
`AutoModelForSequenceClassification`, num_labels=1, whose `score` layer is the head). Arrays
cross the seam as NumPy, batches as `dockyard.policy.TrainBatch` (right-padded; only input_ids
and attention_mask are read).

The scalar of a row is the head applied to the final-norm hidden state at the row's LAST REAL
token, index attention_mask.sum() - 1 (`last_token_index`), on both backends. transformers'
sequence-classification models pick instead the rightmost token that is not `pad_token_id`,
which on a model whose pad token is its EOS (SmolLM2, many others) skips the EOS that ends every
completion here; so neither backend uses that pooling (the torch one calls the base model and the
`score` layer itself).

The saved form (`save_hf`) is the layout of an HF `*ForSequenceClassification` checkpoint with
num_labels=1, the same from both backends: config.json (architectures
['<Family>ForSequenceClassification'], one label: id2label {'0': 'LABEL_0'}), model.safetensors with the decoder's
`model.*` tensors and `score.weight` [1, hidden] (no `lm_head`), and the tokenizer files. Either
backend's `from_hf` loads it back (the torch one also loads a causal LM with a freshly
initialized head; so does the JAX one, seeded).
"""
from __future__ import annotations

import abc
from typing import Any, Callable, Mapping

import numpy as np

from dockyard.policy import TrainBatch, check_layout

# A reward loss: loss_fn(rewards [B], extras) -> (scalar loss, dict of scalar metrics), in the
# backend's array type (`trainer_jax.reward_loss`, `trainer_torch.reward_loss`).
RewardLossFn = Callable[[Any, Mapping[str, Any]], tuple[Any, Mapping[str, Any]]]

SCORE_WEIGHT = "score.weight"   # the head's HF name, [1, hidden]
HEAD_INIT_STD = 0.02            # a fresh head: normal(0, this), transformers' initializer_range default


def last_token_index(batch: TrainBatch) -> np.ndarray:
  """[B] the index of each row's last real token; rows must be right-padded and non-empty."""
  check_layout(batch)
  lengths = np.asarray(batch.attention_mask).sum(-1).astype(np.int32)
  if (lengths < 1).any():
    raise ValueError(f"reward model: rows {np.nonzero(lengths < 1)[0][:5].tolist()} have no tokens")
  return lengths - 1


def classifier_architecture(architectures) -> list[str]:
  """['Qwen2ForCausalLM'] -> ['Qwen2ForSequenceClassification'] (what config.json names)."""
  out = []
  for arch in architectures or ():
    base = arch.removesuffix("ForCausalLM").removesuffix("ForSequenceClassification")
    out.append(base + "ForSequenceClassification")
  if not out:
    raise ValueError("config.json names no architecture to derive the reward model's from")
  return out


class RewardModel(abc.ABC):
  """A decoder + scalar head: one reward per right-padded row."""

  @classmethod
  @abc.abstractmethod
  def from_hf(cls, path: str, config: Any, trainable: bool = True) -> "RewardModel":
    """From an HF directory: a reward model saved by `save_hf`, or a causal LM (a fresh head,
    seeded by config.run.seed). With `trainable`, an optimizer on config.optim (lr,
    weight_decay, max_grad_norm); without (scoring only, `envs.reward_model`), no optimizer
    state and `train_step` raises."""

  @abc.abstractmethod
  def rewards(self, batch: TrainBatch) -> np.ndarray:
    """[B] float32: the head at each row's last real token (`last_token_index`)."""

  @abc.abstractmethod
  def train_step(self, batch: TrainBatch, loss_fn: RewardLossFn) -> dict[str, float]:
    """One AdamW step (global-norm clipped) on loss_fn(rewards, batch.extras); its metrics plus
    grad_norm."""

  @abc.abstractmethod
  def save_hf(self, path: str) -> None:
    """Writes the reward model as an HF directory (the layout in the module docstring)."""
