"""The refit canary: after a sync, the engine and the trainer must score a fixed probe alike.

vLLM scores the probe with prompt logprobs; the trainer with `Policy.logprobs`. The max and mean
|Δ logprob| are returned as metrics, and past `max_abs_logprob_delta` the canary raises: a wrong
name map (q/k swapped, a transpose dropped) or a stale packed weight (CPU vLLM's tied lm_head)
shows up here long before it shows up in a reward curve. Both sides score the raw model (T=1):
vLLM's prompt logprobs skip its sampler, so they stay raw under the engines'
`logprobs_mode="processed_logprobs"`, and the probe `TrainBatch` has temperature 1.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from dockyard.policy import Policy, TrainBatch


class RefitCanaryError(RuntimeError):
  """The engine's logprobs disagree with the trainer's after a weight sync."""


@dataclasses.dataclass
class RefitCanary:
  probe_ids: np.ndarray          # [B, T] token ids, fixed for the run
  max_abs_logprob_delta: float

  def __post_init__(self):
    self.probe_ids = np.asarray(self.probe_ids, np.int32)
    if self.probe_ids.ndim != 2 or self.probe_ids.shape[1] < 2:
      raise ValueError(f"canary probe_ids must be [batch, >=2 tokens], got shape {self.probe_ids.shape}")
    if not self.max_abs_logprob_delta > 0:
      raise ValueError(f"config.refit.canary.max_abs_logprob_delta must be > 0, got {self.max_abs_logprob_delta}")

  @classmethod
  def random(cls, vocab_size: int, max_abs_logprob_delta: float, batch: int = 2, length: int = 32,
             seed: int = 1234) -> "RefitCanary":
    ids = np.random.default_rng(seed).integers(0, vocab_size, size=(batch, length))
    return cls(ids, max_abs_logprob_delta)

  def measure(self, policy: Policy, generator) -> dict[str, float]:
    """Scores the probe on both sides; returns {'max_abs_logprob_delta', 'mean_abs_logprob_delta'}."""
    ids = self.probe_ids
    ones = np.ones_like(ids)
    trainer = np.asarray(policy.logprobs(TrainBatch(ids, ones, ones)), np.float64)[:, 1:]
    engine = np.stack([np.asarray(r, np.float64) for r in generator.prompt_logprobs(ids.tolist())])[:, 1:]
    delta = np.abs(trainer - engine)
    if not np.all(np.isfinite(delta)):
      return {"max_abs_logprob_delta": float("inf"), "mean_abs_logprob_delta": float("inf")}
    return {"max_abs_logprob_delta": float(delta.max()), "mean_abs_logprob_delta": float(delta.mean())}

  def check(self, policy: Policy, generator, version: int | None = None) -> dict[str, float]:
    metrics = self.measure(policy, generator)
    if not metrics["max_abs_logprob_delta"] <= self.max_abs_logprob_delta:
      raise RefitCanaryError(
          f"refit canary failed{'' if version is None else f' at weight version {version}'}: "
          f"max |Δ logprob| {metrics['max_abs_logprob_delta']:.3g} (mean "
          f"{metrics['mean_abs_logprob_delta']:.3g}) > config.refit.canary.max_abs_logprob_delta="
          f"{self.max_abs_logprob_delta}; the engine's weights do not match the trainer's (check "
          f"the name map: transposes, q/k/v order, tied embeddings)")
    return metrics
