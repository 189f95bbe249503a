"""Training checkpoints: one orbax `CheckpointManager` for model + optimizer + step + data iterator.

Each checkpoint is a composite of `nnx.state(model)`, `nnx.state(optimizer)` (its step and Adam
moments), a small JSON of bookkeeping (step, metrics) and, when given, the grain iterator's state.
Retention: the newest `keep_latest` checkpoints (to resume from) plus the best `keep_top_k` by
`metric` (`metric_mode` max|min) among those saved with metrics; orbax's preservation policies do
both at once, so resuming never depends on the newest checkpoint happening to be among the best.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

import grain
import jax
import orbax.checkpoint as ocp
from flax import nnx
from orbax.checkpoint import checkpoint_managers as cm


class Checkpointer:
  def __init__(self, directory: str, *, keep_top_k: int | None = None, metric: str | None = None,
               metric_mode: str = "max", keep_latest: int = 1, async_save: bool = False):
    if metric_mode not in ("max", "min"):
      raise ValueError(f"checkpoint metric_mode must be 'max' or 'min', got {metric_mode!r}")
    if keep_top_k is not None and keep_top_k < 1:
      raise ValueError(f"checkpoint keep_top_k must be >= 1, got {keep_top_k}")
    policies: list[cm.PreservationPolicy] = [cm.LatestN(n=keep_latest)]
    if keep_top_k and metric:
      policies.append(cm.BestN(get_metric_fn=lambda m: m[metric], reverse=False, n=keep_top_k,
                               keep_checkpoints_without_metrics=False))
      self._best_sign = 1.0 if metric_mode == "max" else -1.0
    self.metric = metric
    self.directory = os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(
        preservation_policy=cm.AnyPreservationPolicy(policies) if len(policies) > 1 else policies[0],
        enable_async_checkpointing=async_save, create=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options)

  def _ranked(self, metrics: Mapping[str, float] | None):
    # BestN keeps the largest get_metric_fn values; a 'min' metric is stored negated under a
    # private key so the original value stays readable.
    if metrics is None or not self.metric:
      return metrics
    if self.metric not in metrics:
      raise KeyError(f"checkpoint metric {self.metric!r} missing from metrics {sorted(metrics)}")
    out = {k: float(v) for k, v in metrics.items()}
    out[self.metric] = self._best_sign * float(metrics[self.metric])
    return out

  def save(self, step: int, model: nnx.Module, optimizer: nnx.Optimizer, *, data_iter=None,
           metrics: Mapping[str, float] | None = None, extra: Mapping[str, Any] | None = None) -> None:
    args = dict(
        model=ocp.args.StandardSave(nnx.state(model)),
        optimizer=ocp.args.StandardSave(nnx.state(optimizer)),
        meta=ocp.args.JsonSave({"step": int(step), "metrics": dict(metrics or {}), **(extra or {})}),
    )
    if data_iter is not None:
      args["data"] = grain.checkpoint.CheckpointSave(data_iter)
    self.manager.save(int(step), args=ocp.args.Composite(**args), metrics=self._ranked(metrics),
                      force=True)
    self.manager.wait_until_finished()

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def restore(self, model: nnx.Module, optimizer: nnx.Optimizer | None = None, *, step: int | None = None,
              data_iter=None) -> dict:
    """Restores in place (onto the current shardings); returns the saved bookkeeping JSON."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")

    def target(state):
      return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    args = dict(model=ocp.args.StandardRestore(target(nnx.state(model))),
                meta=ocp.args.JsonRestore())
    if optimizer is not None:
      args["optimizer"] = ocp.args.StandardRestore(target(nnx.state(optimizer)))
    if data_iter is not None:
      args["data"] = grain.checkpoint.CheckpointRestore(data_iter)
    out = self.manager.restore(step, args=ocp.args.Composite(**args))
    nnx.update(model, out["model"])
    if optimizer is not None:
      nnx.update(optimizer, out["optimizer"])
    return dict(out["meta"])

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()
