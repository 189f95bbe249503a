"""Records of one GRPO step (a `Group` per prompt) and their packing into a `TrainBatch`.

A group is one prompt and its n sampled completions, then their rewards, shaped rewards and
advantages as the step fills them in. `make_train_batch` lays groups out right-padded for the
`Policy` seam: each row is prompt + completion, `loss_mask` is 1 on the completion tokens (on
those of them the completion's own `loss_mask` marks, for a multi-turn episode whose completion
holds tool results too), and the per-token extras (generation logprobs, later prev/reference logprobs) sit at the positions
of the tokens they score, the alignment `Policy.logprobs` uses. The batch carries the sampling
temperature, so the trainer scores the distribution that drew the tokens (as the engine's
generation logprobs do), not the raw T=1 model. Rows are right-padded: the trainers' positions
are 0..T-1 along a row, and `dockyard.policy.check_layout` refuses left padding.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from dockyard.envs.base import Reward
from dockyard.policy import TrainBatch
from dockyard.rollout.base import Completion


@dataclasses.dataclass
class Group:
  task: Mapping[str, Any]
  prompt_ids: list[int]
  completions: list[Completion]
  texts: list[str] = dataclasses.field(default_factory=list)        # decoded completions
  rewards: list[Reward] = dataclasses.field(default_factory=list)   # raw, from the env
  shaped: np.ndarray | None = None       # [n] rewards after shaping
  advantages: np.ndarray | None = None   # [n]

  @property
  def size(self) -> int:
    return len(self.completions)


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def pack_sequences(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                   pad_id: int, pad_multiple: int = 1,
                   completion_masks: Sequence[Sequence[int] | None] | None = None) -> TrainBatch:
  """Right-padded prompt+completion rows; loss_mask on the completion tokens, or on those a row's
  `completion_masks` entry marks (None: all of them)."""
  if len(prompts) != len(completions) or not prompts:
    raise ValueError(f"need the same non-zero number of prompts and completions, got "
                     f"{len(prompts)} and {len(completions)}")
  masks = list(completion_masks) if completion_masks is not None else [None] * len(prompts)
  if len(masks) != len(prompts):
    raise ValueError(f"{len(masks)} completion masks for {len(prompts)} rows")
  lengths = [len(p) + len(c) for p, c in zip(prompts, completions)]
  # Rounding T up keeps the number of distinct shapes (and so of jit compilations) small.
  t = _round_up(max(lengths), max(pad_multiple, 1))
  b = len(prompts)
  input_ids = np.full((b, t), pad_id, np.int32)
  attention = np.zeros((b, t), np.int32)
  loss_mask = np.zeros((b, t), np.float32)
  for i, (p, c, m) in enumerate(zip(prompts, completions, masks)):
    if not p:
      raise ValueError(f"row {i}: empty prompt (position 0 has nothing to condition on)")
    if m is not None and len(m) != len(c):
      raise ValueError(f"row {i}: a loss mask of {len(m)} for {len(c)} completion tokens")
    input_ids[i, :lengths[i]] = list(p) + list(c)
    attention[i, :lengths[i]] = 1
    loss_mask[i, len(p):lengths[i]] = 1 if m is None else m
  return TrainBatch(input_ids=input_ids, attention_mask=attention, loss_mask=loss_mask)


def make_train_batch(groups: Sequence[Group], pad_id: int, pad_multiple: int = 1,
                     temperature: float = 1.0) -> TrainBatch:
  """Packs scored groups: extras `advantages` [B] and `generation_logprobs` [B, T], and the
  `temperature` the completions were sampled at (their logprobs are under softmax(z / T))."""
  prompts, completions, masks, advantages, gen_lps = [], [], [], [], []
  for g in groups:
    if g.advantages is None:
      raise ValueError(f"group {g.task.get('instance_id', '?')!r} has no advantages yet")
    for c, a in zip(g.completions, g.advantages):
      if len(c.logprobs) != len(c.token_ids):
        raise ValueError(f"completion of {g.task.get('instance_id', '?')!r}: {len(c.token_ids)} "
                         f"tokens but {len(c.logprobs)} logprobs (ask the sampler for logprobs)")
      prompts.append(g.prompt_ids)
      completions.append(c.token_ids)
      masks.append(c.loss_mask)
      advantages.append(a)
      gen_lps.append(c.logprobs)
  batch = pack_sequences(prompts, completions, pad_id, pad_multiple, masks)
  gen = np.zeros(batch.input_ids.shape, np.float32)
  for i, (p, lps) in enumerate(zip(prompts, gen_lps)):
    gen[i, len(p):len(p) + len(lps)] = lps
  batch.extras["advantages"] = np.asarray(advantages, np.float32)
  batch.extras["generation_logprobs"] = gen
  batch.temperature = float(temperature)
  return batch
