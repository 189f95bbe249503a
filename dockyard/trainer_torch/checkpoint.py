"""Training checkpoints with torch distributed checkpoint (DCP), laid out like the JAX trainer's.

`Checkpointer(directory)` keeps one sub-directory per step (`directory/<step>/`, as orbax's
`CheckpointManager` does), so the GRPO loop drives both backends the same way. Each holds the DCP
shards of `{"model", "optim"}` from `get_state_dict` (sharded DTensors: every rank writes its own
shards in parallel; `dcp.load` reads them back in place and reshards if the world size changed),
`meta.json` (step, the LR override) and, when given, the data iterator's state.
Retention: the newest `keep_latest`, as on the JAX side (the best by a validation metric is the
GRPO loop's, `dockyard.grpo.checkpoints.BestK`). A step directory is written under a temporary name and renamed when complete.
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Any, Mapping

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

META, DATA_JSON, DATA_BIN = "meta.json", "data_state.json", "data_state.bin"


def _rank() -> int:
  return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
  if dist.is_initialized() and dist.get_world_size() > 1:
    dist.barrier()


class Checkpointer:
  def __init__(self, directory: str, *, keep_latest: int = 1, trainable_only: bool = False):
    """`trainable_only`: save and restore only parameters with requires_grad (the LoRA adapters;
    the frozen base is rebuilt from its HF checkpoint, not written per step)."""
    if keep_latest < 1:
      raise ValueError(f"checkpoint keep_latest must be >= 1, got {keep_latest}")
    self.directory = os.path.abspath(directory)
    self.keep_latest = keep_latest
    self.trainable_only = trainable_only
    self.options = StateDictOptions(ignore_frozen_params=trainable_only, strict=not trainable_only)

  def _model_state(self, model: torch.nn.Module, model_sd: dict) -> dict:
    if not self.trainable_only:
      return model_sd
    # ignore_frozen_params keeps a tied weight under its second name (lm_head.weight): filter
    # by what actually trains.
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    return {k: v for k, v in model_sd.items() if k in trainable}

  def all_steps(self) -> list[int]:
    if not os.path.isdir(self.directory):
      return []
    return sorted(int(d) for d in os.listdir(self.directory)
                  if d.isdigit() and os.path.exists(os.path.join(self.directory, d, META)))

  def latest_step(self) -> int | None:
    steps = self.all_steps()
    return steps[-1] if steps else None

  def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, data_iter=None,
           extra: Mapping[str, Any] | None = None) -> None:
    final = os.path.join(self.directory, str(int(step)))
    tmp = final + ".tmp"
    if _rank() == 0:
      shutil.rmtree(tmp, ignore_errors=True)
      os.makedirs(tmp)
    _barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer, options=self.options)
    dcp.save({"model": self._model_state(model, model_sd), "optim": optim_sd}, checkpoint_id=tmp)
    if _rank() == 0:  # every rank holds the same bookkeeping and data iterator (SPMD loop)
      meta = {"step": int(step), **(extra or {})}
      with open(os.path.join(tmp, META), "w") as f:
        json.dump(meta, f)
      if data_iter is not None:
        state = data_iter.get_state()
        if isinstance(state, bytes):
          with open(os.path.join(tmp, DATA_BIN), "wb") as f:
            f.write(state)
        else:
          with open(os.path.join(tmp, DATA_JSON), "w") as f:
            json.dump(state, f)
    _barrier()  # all shards are on disk before the step becomes visible
    if _rank() == 0:
      shutil.rmtree(final, ignore_errors=True)
      os.rename(tmp, final)
      self._prune()
    _barrier()

  def _prune(self) -> None:
    steps = self.all_steps()
    keep = set(steps[-self.keep_latest:])
    for s in steps:
      if s not in keep:
        shutil.rmtree(os.path.join(self.directory, str(s)), ignore_errors=True)

  def meta(self, step: int | None = None) -> dict:
    """The bookkeeping (meta.json) of the newest checkpoint (or `step`), without loading it."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    with open(os.path.join(self.directory, str(int(step)), META)) as f:
      return json.load(f)

  def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
              step: int | None = None, data_iter=None) -> dict:
    """Restores in place (onto the current sharding); returns the saved bookkeeping (meta.json)."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    path = os.path.join(self.directory, str(int(step)))
    if not os.path.exists(os.path.join(path, ".metadata")):
      raise FileNotFoundError(f"{path!r} is not a torch distributed checkpoint (no .metadata)")
    # also materializes empty AdamW state
    model_sd, optim_sd = get_state_dict(model, optimizer, options=self.options)
    state = {"model": self._model_state(model, model_sd), "optim": optim_sd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=self.options)
    with open(os.path.join(path, META)) as f:
      meta = json.load(f)
    if data_iter is not None:
      if os.path.exists(os.path.join(path, DATA_BIN)):
        with open(os.path.join(path, DATA_BIN), "rb") as f:
          data_iter.set_state(f.read())
      elif os.path.exists(os.path.join(path, DATA_JSON)):
        with open(os.path.join(path, DATA_JSON)) as f:
          data_iter.set_state(json.load(f))
      else:
        raise FileNotFoundError(f"{path!r} holds no data iterator state, but one was passed to restore")
    return meta
