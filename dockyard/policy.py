"""The `Policy` seam: what the GRPO loops need from a trainer, whatever its framework.

Implemented by `dockyard.trainer_jax` (the main trainer) and `dockyard.trainer_torch`. Arrays
cross this seam as NumPy; `named_weights()` yields HF names through `dockyard.refit.name_map`.
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
  """
  input_ids: np.ndarray
  attention_mask: np.ndarray
  loss_mask: np.ndarray
  extras: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

  @property
  def batch_size(self) -> int:
    return int(self.input_ids.shape[0])


# A loss callable: loss_fn(logprobs [B,T], loss_mask [B,T], extras: dict[str, array]) ->
# (scalar loss, dict of scalar metrics), in the backend's array type (jnp or torch), traceable.
# Micro-batching contract: the trainer splits a batch into micro-batches, adds to every micro-
# batch's extras the whole batch's `total_tokens` (sum of loss_mask, float scalar) and
# `total_sequences` (sequences with any loss token, float scalar), SUMS the losses, gradients and
# metrics over micro-batches. So a loss fn normalizes by those totals (not by its micro-batch's
# counts), and the sum over micro-batches equals the full-batch value exactly.
LossFn = Callable[[Any, Any, Mapping[str, Any]], tuple[Any, Mapping[str, Any]]]


class Policy(abc.ABC):
  """A trainable language-model policy."""

  @classmethod
  @abc.abstractmethod
  def from_hf(cls, path: str, config: Any) -> "Policy":
    """Builds the policy from an HF checkpoint directory (config.json + safetensors)."""

  @abc.abstractmethod
  def logprobs(self, batch: TrainBatch) -> np.ndarray:
    """Per-token logprobs [B, T]: entry t is log p(input_ids[t] | input_ids[:t]); entry 0 is 0."""

  @abc.abstractmethod
  def train_step(self, batch: TrainBatch, loss_fn: LossFn) -> dict[str, float]:
    """One optimizer step (with micro-batch accumulation) on `batch`; returns scalar metrics."""

  @abc.abstractmethod
  def named_weights(self) -> Iterator[tuple[str, np.ndarray]]:
    """Streams (hf_name, array) pairs in HF layout, through the refit name-map."""

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
