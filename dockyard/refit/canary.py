"""The refit canary: after a sync, the engine and the trainer must score a fixed probe alike.

vLLM scores the probe with prompt logprobs; the trainer with `Policy.logprobs`. The max and mean
|Δ logprob| are returned as metrics, and past `max_abs_logprob_delta` the canary raises: a wrong
name map (q/k swapped, a transpose dropped) or a stale packed weight (CPU vLLM's tied lm_head)
shows up here long before it shows up in a reward curve. Both sides score the raw model (T=1):
vLLM's prompt logprobs skip its sampler, so they stay raw under the engines'
`logprobs_mode="processed_logprobs"`, and the probe `TrainBatch` has temperature 1.

A sync that changed nothing passes that bound when the trainer moved less than it since the last
sync (a small LoRA step: an adapter that never reached the engine looks like ordinary staleness).
So the canary also remembers the last passing probe scores of both sides and checks that the
engine FOLLOWED the trainer: once the trainer's scores moved clearly past the measured noise
(`TRACK_NOISE_FACTOR` x the last sync's max |delta|), the engine's change must match the
trainer's to within half of it (`tracking_error` = max |Δengine - Δtrainer| / max |Δtrainer|
<= `MAX_TRACKING_ERROR`); an engine that kept its old weights has tracking_error 1.

`max_mean_abs_logprob_delta` (off by default) is for an engine whose arithmetic differs from the
trainer's: a bfloat16 MoE engine against an fp32 trainer (Qwen3-Next on CPU vLLM,
docs/qwen3_next.md) picks other experts where router scores are near ties, so single tokens
differ by up to ~1 nat while the mean stays ~3e-2. With it set, the mean |Δ logprob| is bounded
too, and the tracking check compares mean changes instead of max changes (the max of a row with a
flipped route is that flip, not the sync).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses

import numpy as np

TRACK_NOISE_FACTOR = 8.0   # trainer moves below this x the last sync's delta are noise: untracked
MAX_TRACKING_ERROR = 0.5

from dockyard.policy import Policy, TrainBatch


class RefitCanaryError(RuntimeError):
  """The engine's logprobs disagree with the trainer's after a weight sync."""


@dataclasses.dataclass
class RefitCanary:
  probe_ids: np.ndarray          # [B, T] token ids, fixed for the run
  max_abs_logprob_delta: float
  max_mean_abs_logprob_delta: float | None = None   # None: the max bound alone (module docstring)
  # (trainer, engine, max |delta| or, under the mean bound, mean |delta|) of the last passing sync
  _last: tuple | None = dataclasses.field(default=None, init=False, repr=False)

  def __post_init__(self):
    self.probe_ids = np.asarray(self.probe_ids, np.int32)
    if self.probe_ids.ndim != 2 or self.probe_ids.shape[1] < 2:
      raise ValueError(f"canary probe_ids must be [batch, >=2 tokens], got shape {self.probe_ids.shape}")
    if not self.max_abs_logprob_delta > 0:
      raise ValueError(f"config.refit.canary.max_abs_logprob_delta must be > 0, got {self.max_abs_logprob_delta}")
    if self.max_mean_abs_logprob_delta is not None and not self.max_mean_abs_logprob_delta > 0:
      raise ValueError(f"max_mean_abs_logprob_delta must be > 0 or None, got {self.max_mean_abs_logprob_delta}")

  @classmethod
  def random(cls, vocab_size: int, max_abs_logprob_delta: float, batch: int = 2, length: int = 32,
             seed: int = 1234, max_mean_abs_logprob_delta: float | None = None) -> "RefitCanary":
    ids = np.random.default_rng(seed).integers(0, vocab_size, size=(batch, length))
    return cls(ids, max_abs_logprob_delta, max_mean_abs_logprob_delta)

  def _score(self, policy: Policy, generator) -> tuple[np.ndarray, np.ndarray]:
    """Both sides' probe logprobs. Engines in other processes (a Ray fleet) score in a thread
    while the trainer scores here, so the canary takes the longer of the two, not their sum; an
    engine in this process scores on this thread (CPU vLLM's attention checks that it runs with
    the OpenMP thread count it was set up with, which a new thread does not have)."""
    ids = self.probe_ids
    ones = np.ones_like(ids)
    probe = TrainBatch(ids, ones, ones)
    if getattr(generator, "in_process", True):
      engine_rows = generator.prompt_logprobs(ids.tolist())
      trainer = np.asarray(policy.logprobs(probe), np.float64)[:, 1:]
    else:
      with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="canary") as pool:
        pending = pool.submit(generator.prompt_logprobs, ids.tolist())
        trainer = np.asarray(policy.logprobs(probe), np.float64)[:, 1:]
        engine_rows = pending.result()
    engine = np.stack([np.asarray(r, np.float64) for r in engine_rows])[:, 1:]
    return trainer, engine

  @staticmethod
  def _deltas(trainer, engine) -> dict[str, float]:
    delta = np.abs(trainer - engine)
    if not np.all(np.isfinite(delta)):
      return {"max_abs_logprob_delta": float("inf"), "mean_abs_logprob_delta": float("inf")}
    return {"max_abs_logprob_delta": float(delta.max()), "mean_abs_logprob_delta": float(delta.mean())}

  def measure(self, policy: Policy, generator) -> dict[str, float]:
    """Scores the probe on both sides; returns {'max_abs_logprob_delta', 'mean_abs_logprob_delta'}."""
    return self._deltas(*self._score(policy, generator))

  def check(self, policy: Policy, generator, version: int | None = None) -> dict[str, float]:
    """Raises `RefitCanaryError` when the engine disagrees with the trainer, or did not follow
    the trainer's change since the last passing check; returns the metrics."""
    trainer, engine = self._score(policy, generator)
    metrics = self._deltas(trainer, engine)
    if self._last is not None:
      metrics.update(self._tracking(trainer, engine, version))
    if not metrics["max_abs_logprob_delta"] <= self.max_abs_logprob_delta:
      raise RefitCanaryError(
          f"refit canary failed{'' if version is None else f' at weight version {version}'}: "
          f"max |Δ logprob| {metrics['max_abs_logprob_delta']:.3g} (mean "
          f"{metrics['mean_abs_logprob_delta']:.3g}) > config.refit.canary.max_abs_logprob_delta="
          f"{self.max_abs_logprob_delta}; the engine's weights do not match the trainer's (check "
          f"the name map: transposes, q/k/v order, tied embeddings){self._dtype_hint(generator)}")
    mean_bound = self.max_mean_abs_logprob_delta
    if mean_bound is not None and not metrics["mean_abs_logprob_delta"] <= mean_bound:
      raise RefitCanaryError(
          f"refit canary failed{'' if version is None else f' at weight version {version}'}: "
          f"mean |Δ logprob| {metrics['mean_abs_logprob_delta']:.3g} > "
          f"config.refit.canary.max_mean_abs_logprob_delta={mean_bound} (max "
          f"{metrics['max_abs_logprob_delta']:.3g}); the engine's weights do not match the trainer's")
    noise = metrics["max_abs_logprob_delta" if mean_bound is None else "mean_abs_logprob_delta"]
    self._last = (trainer, engine, noise)
    return metrics

  def reset(self) -> None:
    """Forgets the last passing scores (the engine's weights were replaced outside a sync), so
    the next check applies the absolute bound alone."""
    self._last = None

  @staticmethod
  def _dtype_hint(generator) -> str:
    dtype = getattr(generator, "dtype", None)
    if dtype in ("bfloat16", "float16"):
      return (f"; the engine runs {dtype}: its gap to an fp32 trainer is larger than fp32's (for "
              f"qwen3_next on CPU see docs/qwen3_next.md)")
    return ""

  def _tracking(self, trainer, engine, version) -> dict[str, float]:
    last_trainer, last_engine, last_noise = self._last
    d_trainer, d_engine = trainer - last_trainer, engine - last_engine
    stat = np.max if self.max_mean_abs_logprob_delta is None else np.mean
    moved = float(stat(np.abs(d_trainer)))
    out = {"trainer_change": moved, "engine_change": float(stat(np.abs(d_engine)))}
    if moved > TRACK_NOISE_FACTOR * max(last_noise, 1e-7):
      out["tracking_error"] = float(stat(np.abs(d_engine - d_trainer))) / moved
      if not out["tracking_error"] <= MAX_TRACKING_ERROR:
        raise RefitCanaryError(
            f"refit canary failed{'' if version is None else f' at weight version {version}'}: the "
            f"engine did not follow the trainer: since the last sync the trainer's probe logprobs "
            f"moved by up to {moved:.3g}, the engine's by {out['engine_change']:.3g} (tracking error "
            f"{out['tracking_error']:.2f} > {MAX_TRACKING_ERROR}); the sync changed nothing, or "
            f"the wrong thing (a LoRA adapter or merged projection that never reached the engine)")
    return out
