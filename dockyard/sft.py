"""The one supervised fine-tuning loop: `sft_loop` trains any Policy through its seam.

Every SFT entry point runs it and differs only in what it feeds it and does after each step:
`dockyard.supervised.loop.sft_train` (configs/sft.py: chat data with the assistant-turn mask,
held-out loss and pass@1, metrics to the run's writer, checkpoints and resume),
`dockyard.grpo.sft.sft_warmup` (the GRPO warm start: random batches of gold answers, metrics to the
run's writer) and `dockyard.trainer_jax.sft.run_sft` (standalone SFT from a JSONL: a grain
pipeline, JSON log lines, orbax checkpoints and resume). Depends on `dockyard.policy` only.
"""
from __future__ import annotations

import time
from typing import Callable, Iterable, Iterator

from dockyard.policy import LossFn, Policy, TrainBatch


def sft_loop(policy: Policy, batches: Iterator[TrainBatch] | Callable[[], TrainBatch],
             steps: Iterable[int], loss_fn: LossFn, *, lr: float | None = None,
             on_step: Callable[[int, dict[str, float], float], None] | None = None,
             save: Callable[[int], None] | None = None) -> None:
  """`for step in steps`: next batch, `policy.train_step`, then `on_step`, then `save`.

  batches: an iterator of TrainBatch, or a callable returning the next one.
  lr:      a constant learning rate for these steps (`policy.set_lr`); the policy returns to its
           schedule afterwards, also when a step raises. None: the schedule throughout.
  on_step: called as on_step(step, metrics, seconds): the step's metrics as floats and its wall
           time, fetching the batch included.
  save:    called as save(step) after on_step; it decides whether this step is checkpointed.
  """
  next_batch = batches if callable(batches) else lambda: next(batches)
  if lr is not None:
    policy.set_lr(lr)
  try:
    for step in steps:
      t0 = time.perf_counter()
      metrics = {k: float(v) for k, v in policy.train_step(next_batch(), loss_fn).items()}
      seconds = time.perf_counter() - t0
      if on_step is not None:
        on_step(step, metrics, seconds)
      if save is not None:
        save(step)
  finally:
    if lr is not None:
      policy.set_lr(None)
