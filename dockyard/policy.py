"""The `Policy` seam: what the GRPO loops need from a trainer, whatever its framework.

Implemented by `dockyard.trainer_jax` (the main trainer) and `dockyard.trainer_torch`. Arrays
cross this seam as NumPy; `named_weights()` yields HF names through `dockyard.models.name_map`.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable, Iterator, Mapping

import numpy as np


@dataclasses.dataclass
class TrainBatch:
  """A right-padded batch of sequences (prompt + completion) for scoring or training.

  input_ids:     [B, T] int32 token ids, right-padded.
  attention_mask:[B, T] 1 for real tokens, 0 for padding.
  loss_mask:     [B, T] 1 on tokens that are trained on (completion tokens), 0 elsewhere.
                 Aligned with `input_ids`: position t masks the prediction OF token t.
  extras:        per-token or per-sequence arrays the loss needs (advantages [B] or [B,T],
                 generation logprobs [B,T], reference logprobs [B,T], ...).
  temperature:   the sampling temperature T of the distribution the logprobs are taken under:
                 the policy scores (and trains) softmax(logits / T), the distribution that drew
                 a GRPO batch's tokens. 1 (the raw model) for SFT and for the refit canary.
  """
  input_ids: np.ndarray
  attention_mask: np.ndarray
  loss_mask: np.ndarray
  extras: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
  temperature: float = 1.0

  @property
  def batch_size(self) -> int:
    return int(self.input_ids.shape[0])


def check_layout(batch: TrainBatch) -> None:
  """Rejects what the trainers would score silently wrong: left padding (their positions are
  0..T-1 along the row, so a row that starts with padding would put its first real token at
  position > 0) and a temperature that is not a positive number."""
  am = np.asarray(batch.attention_mask)
  if am.ndim == 2 and am.shape[1] > 1:
    bad = np.nonzero((am[:, 1:] > am[:, :-1]).any(axis=1))[0]
    if bad.size:
      row = am[bad[0]]
      raise ValueError(f"TrainBatch rows {bad[:5].tolist()} are not right-padded (row {bad[0]}'s "
                       f"attention_mask starts {row[:12].tolist()}): padding must come after the "
                       f"tokens, since positions run 0..T-1 along the row (left padding would "
                       f"shift them); pack rows with dockyard.grpo.batch.pack_sequences")
  t = batch.temperature
  if not (isinstance(t, (int, float, np.floating)) and np.isfinite(t) and t > 0):
    raise ValueError(f"TrainBatch.temperature must be a finite number > 0, got {t!r} (greedy "
                     f"decoding, T=0, has no distribution to train)")


# A loss callable: loss_fn(logprobs [B,T], loss_mask [B,T], extras: dict[str, array]) ->
# (scalar loss, dict of scalar metrics), in the backend's array type (jnp or torch), traceable.
# Micro-batching contract: the trainer splits a batch into micro-batches, adds to every micro-
# batch's extras the whole batch's `total_tokens` (sum of loss_mask, float scalar) and
# `total_sequences` (sequences with any loss token, float scalar), SUMS the losses, gradients and
# metrics over micro-batches. So a loss fn normalizes by those totals (not by its micro-batch's
# counts), and the sum over micro-batches equals the full-batch value exactly.
# Top-k contract: when a batch's extras hold `topk_ids` [B, T, K] (int token ids per position,
# e.g. teachers' top-k from `Policy.topk_logprobs`), the trainer also hands the loss
# `topk_logprobs` [B, T, K]: the policy's own logprobs of those ids at each position, with
# gradient, aligned and tempered as `logprobs` (entry t predicts token t; entry 0 is 0). Unpacked
# batches only (`policy.packing_row_tokens` off; on the torch trainer `optim.micro_batch_tokens`
# off too, while the JAX trainer's token-budget micro-batches keep the contract).
LossFn = Callable[[Any, Any, Mapping[str, Any]], tuple[Any, Mapping[str, Any]]]


class Policy(abc.ABC):
  """A trainable language-model policy."""

  @classmethod
  @abc.abstractmethod
  def from_hf(cls, path: str, config: Any) -> "Policy":
    """Builds the policy from an HF checkpoint directory (config.json + safetensors)."""

  @abc.abstractmethod
  def logprobs(self, batch: TrainBatch) -> np.ndarray:
    """Per-token logprobs [B, T]: entry t is log p_T(input_ids[t] | input_ids[:t]) under
    softmax(logits / batch.temperature); entry 0 is 0. Raises on a left-padded batch."""

  def topk_logprobs(self, batch: TrainBatch, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids [B, T, k] int32, logprobs [B, T, k] float32): at each position t the k most likely
    tokens of p_T(. | input_ids[:t]) under softmax(logits / batch.temperature), most likely
    first, and their logprobs; entry 0 and padding are 0 (ids and logprobs)."""
    raise NotImplementedError(f"{type(self).__name__} has no topk_logprobs")

  @abc.abstractmethod
  def train_step(self, batch: TrainBatch, loss_fn: LossFn) -> dict[str, float]:
    """One optimizer step (with micro-batch accumulation) on `batch`, the loss fed the same
    temperature-scaled logprobs as `logprobs`; returns scalar metrics."""

  @abc.abstractmethod
  def set_lr(self, lr: float | None) -> None:
    """A constant learning rate from the next step on (the SFT warm start's); None returns to the
    policy's schedule where it left it."""

  @abc.abstractmethod
  def named_weights(self, touched_only: bool = False) -> Iterator[tuple[str, np.ndarray]]:
    """Streams (hf_name, array) pairs in HF layout, through the refit name-map, LoRA adapters
    merged into their projections. `touched_only`: only the tensors a training step can change
    (under LoRA the adapted projections; otherwise every weight)."""

  def save_adapter(self, path: str) -> int:
    """Writes the LoRA adapters as a PEFT adapter directory; returns their bytes (refit
    lora_mode='adapter')."""
    raise NotImplementedError(f"{type(self).__name__} has no LoRA adapters to save")

  @abc.abstractmethod
  def save(self, directory: str) -> None:
    """Saves the full training state (weights, optimizer, step) to `directory`."""

  @abc.abstractmethod
  def restore(self, directory: str) -> None:
    """Restores the state written by `save`."""

  @property
  @abc.abstractmethod
  def step(self) -> int:
    """Number of optimizer steps taken."""
