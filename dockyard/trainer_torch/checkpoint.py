"""Training-state checkpoints with torch distributed checkpoint (DCP).

`get_state_dict` gives the model and AdamW state as sharded DTensors; `dcp.save` writes each
rank's shards in parallel (plus one metadata file), and `dcp.load` reads them back into the
live sharded state in place, resharding if the world size changed. The LR schedule is a pure
function of the step (`optim.lr_at`), so the step count is the only other state.
"""
from __future__ import annotations

import os

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


def save(directory: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
  os.makedirs(directory, exist_ok=True)
  model_sd, optim_sd = get_state_dict(model, optimizer)
  state = {"model": model_sd, "optim": optim_sd, "trainer": {"step": torch.tensor(step, dtype=torch.int64)}}
  dcp.save(state, checkpoint_id=directory)


def restore(directory: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
  """Loads `directory` into `model` and `optimizer` in place; returns the saved step."""
  if not os.path.exists(os.path.join(directory, ".metadata")):
    raise FileNotFoundError(f"{directory!r} is not a torch distributed checkpoint (no .metadata)")
  model_sd, optim_sd = get_state_dict(model, optimizer)  # also materializes empty AdamW state
  state = {"model": model_sd, "optim": optim_sd, "trainer": {"step": torch.tensor(0, dtype=torch.int64)}}
  dcp.load(state, checkpoint_id=directory)
  set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
  return int(state["trainer"]["step"])
