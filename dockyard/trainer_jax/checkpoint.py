"""Training checkpoints: one orbax `CheckpointManager` for model + optimizer + step + data iterator.

Each checkpoint is a composite of `nnx.state(model)` (under LoRA: the adapters alone, see
`Checkpointer(model_filter=)`), `nnx.state(optimizer)` (its step and Adam moments), a small JSON of bookkeeping (step, extras) and, when given, the grain iterator's state.
Retention: the newest `keep_latest` checkpoints. Keeping the best by a validation metric is the
GRPO loop's (`dockyard.grpo.checkpoints.BestK`, one for both trainers), not the trainer's.
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
  def __init__(self, directory: str, *, keep_latest: int = 1, async_save: bool = False,
               model_filter: Any = ...):
    """`model_filter`: which part of `nnx.state(model)` is saved and restored; everything by
    default, the LoRA adapters (+ their dropout streams) alone under LoRA, so a checkpoint
    holds the adapters and loads back onto a policy built from the same base."""
    if keep_latest < 1:
      raise ValueError(f"checkpoint keep_latest must be >= 1, got {keep_latest}")
    self.model_filter = model_filter
    self.directory = os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(preservation_policy=cm.LatestN(n=keep_latest),
                                           enable_async_checkpointing=async_save, create=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options)

  def save(self, step: int, model: nnx.Module, optimizer: nnx.Optimizer, *, data_iter=None,
           extra: Mapping[str, Any] | None = None) -> None:
    args = dict(
        model=ocp.args.StandardSave(nnx.state(model, self.model_filter)),
        optimizer=ocp.args.StandardSave(nnx.state(optimizer)),
        meta=ocp.args.JsonSave({"step": int(step), **(extra or {})}),
    )
    if data_iter is not None:
      args["data"] = grain.checkpoint.CheckpointSave(data_iter)
    self.manager.save(int(step), args=ocp.args.Composite(**args), force=True)
    self.manager.wait_until_finished()

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def meta(self, step: int | None = None) -> dict:
    """The bookkeeping JSON of the newest checkpoint (or `step`), without reading any array."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    return dict(self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"])

  def restore(self, model: nnx.Module, optimizer: nnx.Optimizer | None = None, *, step: int | None = None,
              data_iter=None) -> dict:
    """Restores in place (onto the current shardings); returns the saved bookkeeping JSON."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")

    def target(state):
      return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    args = dict(model=ocp.args.StandardRestore(target(nnx.state(model, self.model_filter))),
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
