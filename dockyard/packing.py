"""Sequence packing and token-budget micro-batches: the host-side plan both trainers follow.

A `TrainBatch` stays the seam (right-padded rows, one sequence each) and the `LossFn` contract
does not change. With `policy.packing_row_tokens > 0` a trainer packs the batch's sequences
first-fit decreasing into rows of that many tokens (`first_fit_decreasing`); a micro-batch is
`optim.micro_batch_size` such rows, so it is budgeted in tokens and holds as many sequences as
fit (dynamic batching by packing, NeMo-RL's "sequence packing"). Inside a row each sequence has
its own segment id (1, 2, ...; 0 is the row's padding tail) and positions that restart at 0, so
attention never crosses a segment and RoPE sees the positions the unpacked row would. The model
runs on the packed rows; its per-token logprobs are gathered back (`PackedMicro.gather`: flat
indices into the micro-batch's [rows * row_tokens] logprobs) into the [S, T] layout of the
micro-batch's sequences, and the unchanged loss fn sees that, with the sequences' loss masks and
extras. Losses normalize by whole-batch totals (dockyard/policy.py), so the sum over micro-batches
is exactly the unpacked batch's loss, whatever the grouping.

`optim.micro_batch_tokens > 0` without packing groups whole sequences, longest first, so that
count x longest <= the budget (`token_budget_groups`); each micro-batch is padded only to its own
longest. torch runs those shapes eagerly; the JAX trainer plans on lengths rounded up to its
`policy.seq_bucket` and runs one compiled step per (rows, length) bucket.

Pure NumPy: no framework is imported here.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from dockyard.policy import TrainBatch


def seq_lengths(batch: TrainBatch) -> np.ndarray:
  """Real tokens per row of a right-padded batch."""
  return np.asarray(batch.attention_mask).astype(np.int64).sum(axis=1)


def first_fit_decreasing(lengths: Sequence[int], capacity: int,
                         key: str = "policy.packing_row_tokens") -> list[list[int]]:
  """Bins of sequence indices, each bin's lengths summing to <= capacity: sequences longest
  first (ties by index, so the plan is deterministic), each into the first bin with room.
  Bins come out in creation order (the fullest first)."""
  lengths = [int(n) for n in lengths]
  too_long = [i for i, n in enumerate(lengths) if n > capacity]
  if too_long:
    i = too_long[0]
    raise ValueError(f"config.{key}={capacity}: sequence {i} has {lengths[i]} tokens; a packed "
                     f"row must hold the longest sequence")
  bins: list[list[int]] = []
  free: list[int] = []
  for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
    for j, room in enumerate(free):
      if lengths[i] <= room:
        bins[j].append(i)
        free[j] -= lengths[i]
        break
    else:
      bins.append([i])
      free.append(capacity - lengths[i])
  return bins


def token_budget_groups(lengths: Sequence[int], budget: int,
                        key: str = "optim.micro_batch_tokens") -> list[list[int]]:
  """Micro-batches of whole sequences (no packing), longest first: each holds as many as keep
  count x its longest <= budget (its padded size)."""
  lengths = [int(n) for n in lengths]
  if lengths and max(lengths) > budget:
    raise ValueError(f"config.{key}={budget}: a sequence has {max(lengths)} tokens, more than "
                     f"one micro-batch's budget")
  groups: list[list[int]] = []
  for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
    # Longest first: the group's first member is its longest.
    if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= budget:
      groups[-1].append(i)
    else:
      groups.append([i])
  return groups


@dataclasses.dataclass
class PackedMicro:
  """One micro-batch of packed rows and the way back to its sequences.

  input_ids / positions / segment_ids: [rows, row_tokens] (padding: id 0, segment 0, positions
  0, 1, ... along the tail, so a position-based segmenter also sees it as one segment of its own).
  seqs:   [S] the batch rows (sequence indices) this micro-batch holds, in packing order.
  gather: [S, T] flat index into the [rows * row_tokens] logprobs of the packed rows; valid:
          [S, T] 1 where it points at a real token's logprob (t in 1..len-1; entry 0 of a sequence
          is 0 by the `Policy.logprobs` contract, and a packed row's entry there would be
          conditioned on the previous segment).
  """
  input_ids: np.ndarray
  positions: np.ndarray
  segment_ids: np.ndarray
  seqs: np.ndarray
  gather: np.ndarray
  valid: np.ndarray

  @property
  def tokens(self) -> int:
    return int((self.segment_ids > 0).sum())


def pack_micro_batches(batch: TrainBatch, row_tokens: int, rows_per_micro: int, *,
                       seq_len: int | None = None, trim: bool = False) -> list[PackedMicro]:
  """FFD-packs the batch's sequences into rows of `row_tokens`, `rows_per_micro` rows a
  micro-batch. `seq_len`: the T of the gather layout (default: the batch's). `trim`: cut the
  rows to the longest row in the micro-batch and drop empty rows (an eager trainer's choice; a
  jitted one keeps the fixed [rows_per_micro, row_tokens] so every step hits the compile cache)."""
  if row_tokens < 1 or rows_per_micro < 1:
    raise ValueError(f"row_tokens ({row_tokens}) and rows_per_micro ({rows_per_micro}) must be >= 1")
  ids = np.asarray(batch.input_ids)
  lengths = seq_lengths(batch)
  t = ids.shape[1] if seq_len is None else int(seq_len)
  bins = first_fit_decreasing(lengths, row_tokens)
  out = []
  for start in range(0, len(bins), rows_per_micro):
    rows = bins[start:start + rows_per_micro]
    width = max(sum(int(lengths[i]) for i in row) for row in rows) if trim else row_tokens
    n_rows = len(rows) if trim else rows_per_micro
    p_ids = np.zeros((n_rows, width), np.int32)
    p_seg = np.zeros((n_rows, width), np.int32)
    p_pos = np.broadcast_to(np.arange(width, dtype=np.int32), (n_rows, width)).copy()
    seqs = [i for row in rows for i in row]
    gather = np.zeros((len(seqs), t), np.int32)
    valid = np.zeros((len(seqs), t), np.float32)
    s = 0
    for r, row in enumerate(rows):
      col = 0
      for k, i in enumerate(row):
        n = int(lengths[i])
        p_ids[r, col:col + n] = ids[i, :n]
        p_seg[r, col:col + n] = k + 1
        p_pos[r, col:col + n] = np.arange(n)
        gather[s, :n] = r * width + col + np.arange(n)
        valid[s, 1:n] = 1
        col += n
        s += 1
      p_pos[r, col:] = np.arange(width - col)   # the padding tail: one segment of its own
    out.append(PackedMicro(p_ids, p_pos, p_seg, np.asarray(seqs, np.int64), gather, valid))
  return out

