"""grain pipelines for prompt / SFT datasets: shuffle with a seed, repeat, shard per process, batch.

Built on `grain.MapDataset` (no worker processes: worker_count=0 semantics), turned into an
iterator whose `get_state()` / `set_state()` go into the checkpoint (`grain.checkpoint`), so a
resumed run continues from the exact next batch.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import grain
import jax
import numpy as np


def pipeline(records: Sequence[Any], batch_size: int, *, seed: int = 0, num_epochs: int | None = None,
             shard_index: int | None = None, shard_count: int | None = None,
             transform: Callable[[Any], Any] | None = None,
             batch_fn: Callable[[Sequence[Any]], Any] | None = None) -> grain.IterDataset:
  """records -> [process shard] -> shuffle(seed, reshuffled each epoch) -> repeat -> map -> batch.

  `num_epochs=None` repeats forever. The default shard is this JAX process's; `batch_fn`
  defaults to grain's stacking (use `list` for ragged records such as prompts).
  """
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  if not len(records):
    raise ValueError("the dataset is empty")
  shard_index = jax.process_index() if shard_index is None else shard_index
  shard_count = jax.process_count() if shard_count is None else shard_count
  if not 0 <= shard_index < shard_count:
    raise ValueError(f"shard_index {shard_index} is not in [0, {shard_count})")
  ds = grain.MapDataset.source(list(records))
  ds = ds[shard_index::shard_count]
  if len(ds) < batch_size:
    raise ValueError(f"shard {shard_index}/{shard_count} has {len(ds)} records, fewer than one "
                     f"batch of {batch_size}")
  ds = ds.shuffle(seed=seed).repeat(num_epochs)
  if transform is not None:
    ds = ds.map(transform)
  ds = ds.batch(batch_size, drop_remainder=True, batch_fn=batch_fn)
  # Prefetching threads buy nothing for in-memory records and, on a busy machine, cost seconds per
  # iterator (grain's default starts 16 threads reading 500 elements ahead).
  return ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))


def pad_right(seqs: Sequence[Sequence[int]], length: int, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """Right-pads token lists to [B, length]; returns (ids, attention_mask). Too long is an error."""
  ids = np.full((len(seqs), length), pad_id, np.int32)
  mask = np.zeros((len(seqs), length), np.int32)
  for i, s in enumerate(seqs):
    if len(s) > length:
      raise ValueError(f"sequence {i} has {len(s)} tokens, more than the padded length {length}")
    ids[i, :len(s)] = s
    mask[i, :len(s)] = 1
  return ids, mask
