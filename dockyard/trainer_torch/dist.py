"""The process group, the FSDP device mesh, and how a global batch is split over ranks.

Contract: under `torchrun` every rank calls the policy with the SAME global batch (the loop runs
SPMD, as the JAX trainer does with a global array); each rank trains on its own contiguous slice
of rows and results (logprobs, metrics) are gathered back so every rank sees the whole. A plain
process (no torchrun) gets a one-rank gloo group, so the same FSDP2/DTensor code path runs.
"""
from __future__ import annotations

import atexit
import math
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


def device_type() -> str:
  return "cuda" if torch.cuda.is_available() else "cpu"


def ensure_process_group() -> None:
  """Joins torchrun's group (env:// rendezvous) or starts a one-rank group in this process."""
  if dist.is_initialized():
    return
  backend = "nccl" if device_type() == "cuda" else "gloo"
  if "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
    if device_type() == "cuda":
      torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend)
  else:  # an in-memory store: nothing to rendezvous with
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
  atexit.register(_drain_and_destroy)


def _drain_and_destroy() -> None:
  """At exit: give gloo's worker threads the GIL, then destroy the group.

  A gloo worker thread that finished an async collective (FSDP2's all-gathers) drops the work's
  last reference to its output tensor, which needs the GIL. If the interpreter is already
  finalizing, that thread is made to exit while unwinding a noexcept destructor and the whole
  process aborts ("terminate called without an active exception") after its work is done, at
  random (torch 2.13, gloo). Sleeping here releases the GIL so those threads finish first.
  """
  if not dist.is_initialized():
    return
  time.sleep(0.2)
  dist.destroy_process_group()


def fsdp_mesh() -> DeviceMesh:
  """A 1-D mesh over all ranks named 'fsdp' (parameters are sharded along it)."""
  ensure_process_group()
  return init_device_mesh(device_type(), (dist.get_world_size(),), mesh_dim_names=("fsdp",))


def rank() -> int:
  return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
  return dist.get_world_size() if dist.is_initialized() else 1


def rows_per_rank(batch_size: int, micro_batch_size: int, world: int) -> tuple[int, int]:
  """(rows each rank gets, micro-batches per rank): equal on every rank, because each micro-batch
  forward/backward is a round of FSDP collectives that all ranks must join."""
  per_rank = math.ceil(batch_size / world)
  n_micro = math.ceil(per_rank / micro_batch_size)
  return n_micro * micro_batch_size, n_micro


def pad_rows(x: np.ndarray, rows: int, fill=0) -> np.ndarray:
  """Appends rows of `fill` up to `rows` (padding rows carry no loss tokens)."""
  if x.shape[0] >= rows:
    return x
  pad = np.full((rows - x.shape[0],) + x.shape[1:], fill, dtype=x.dtype)
  return np.concatenate([x, pad], axis=0)


def all_gather_rows(x: torch.Tensor) -> torch.Tensor:
  """Concatenates every rank's rows (equal shapes on all ranks) in rank order."""
  if world_size() == 1:
    return x
  parts = [torch.empty_like(x) for _ in range(world_size())]
  dist.all_gather(parts, x.contiguous())
  return torch.cat(parts, dim=0)


def all_reduce_tensor(x: torch.Tensor) -> torch.Tensor:
  """Elementwise sum over ranks of an equal-shaped tensor (on the collective's device)."""
  if world_size() == 1:
    return x
  y = x.detach().to(device_type()).contiguous()
  dist.all_reduce(y, op=dist.ReduceOp.SUM)
  return y


def all_reduce_sum(values: dict[str, torch.Tensor]) -> dict[str, float]:
  """Sums scalar tensors over ranks in one collective; returns Python floats."""
  if not values:
    return {}
  keys = sorted(values)
  # On the collective's device: NCCL reduces only GPU tensors, gloo only CPU ones.
  stacked = torch.stack([values[k].detach().to(device_type(), torch.float64).reshape(()) for k in keys])
  if world_size() > 1:
    dist.all_reduce(stacked, op=dist.ReduceOp.SUM)
  return {k: float(v) for k, v in zip(keys, stacked.tolist())}
