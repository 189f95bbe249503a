"""`rm_train`: the reward model's training loop (configs/rm.py, via dockyard.runner).

Through the `RewardModel` seam, whichever backend: per step, `rm.num_pairs_per_step` pairs
(`dpo.data.PairSampler`: seeded epochs, a function of the step) packed interleaved
(`rm.data.make_batch`) -> `model.train_step` with the Bradley-Terry loss -> every
`rm.val_period` steps (and at step 0 and the last) the held-out pairs scored with `model.rewards` and the
NumPy spec (`rm.loss_spec.reward_loss`) evaluated on them: `val/loss`, `val/accuracy` (the
fraction of held-out pairs with r_chosen > r_rejected), `val/rewards_*`, `val/reward_margin`.
One metrics row per step (`train/*`, `val/*`, `time/*`) to metrics.jsonl and TensorBoard, a PNG
of the curves at the end, and the trained model saved as an HF directory in
`<workdir>/reward_model` (`RewardModel.save_hf`). No mid-run checkpoints and no resume (yet).
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Sequence

from dockyard import workdir as workdir_lib
from dockyard.dpo.data import PairSampler
from dockyard.rm import data as data_lib
from dockyard.rm.loss_spec import reward_loss
from dockyard.rm.model import RewardLossFn, RewardModel

PAD_MULTIPLE = 16   # batch lengths round up to this: few distinct shapes, few compilations
MODEL_DIR = "reward_model"


@dataclasses.dataclass
class RmResult:
  steps: int
  last_metrics: dict[str, float]
  val_history: list[dict[str, float]]
  model_dir: str                      # the saved reward model (HF directory)


class HeldOut:
  """The held-out pairs in batches; `__call__(model)` -> the `val/*` metrics of the whole set."""

  def __init__(self, pairs: Sequence[data_lib.EncodedMarginPair], per_batch: int, pad_id: int):
    self.num_pairs = len(pairs)
    self.batches = [data_lib.make_batch(pairs[i:i + per_batch], pad_id, PAD_MULTIPLE)
                    for i in range(0, len(pairs), per_batch)]

  def __call__(self, model: RewardModel) -> dict[str, float]:
    totals: dict[str, float] = {}
    for batch in self.batches:
      # Normalized by all the held-out pairs, so the batches' metrics add up to the whole set's.
      _, metrics = reward_loss(model.rewards(batch), {**batch.extras, "total_pairs": float(self.num_pairs)})
      for k, v in metrics.items():
        totals[k] = totals.get(k, 0.0) + v
    return {f"val/{k}": v for k, v in totals.items()}


def rm_train(config, *, model: RewardModel, tokenizer, train_pairs: Sequence[data_lib.MarginPair],
             val_pairs: Sequence[data_lib.MarginPair], workdir: str, loss_fn: RewardLossFn) -> RmResult:
  """`config.rm.num_steps` steps of `loss_fn` (`policy_factory.make_reward_loss(config)`, the
  model's backend), validating at step 0, every `rm.val_period` steps and at the last; saves the model to <workdir>/reward_model."""
  rm = config.rm
  pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
  max_len = int(config.policy.max_seq_len)
  train = data_lib.encode(tokenizer, train_pairs, max_len)
  sampler = PairSampler(len(train), int(rm.num_pairs_per_step), int(config.run.seed))
  held_out = (HeldOut(data_lib.encode(tokenizer, val_pairs, max_len), int(rm.num_pairs_per_step), pad_id)
              if val_pairs and int(rm.val_period) > 0 else None)
  writer = workdir_lib.MetricWriter(workdir, tensorboard=config.logging.tensorboard)
  val_history: list[dict[str, float]] = []
  metrics: dict[str, float] = {}

  def validate(step):
    t0 = time.perf_counter()
    out = held_out(model)
    out["time/validate"] = time.perf_counter() - t0
    val_history.append({"step": step, **out})
    return out

  try:
    if held_out is not None:
      writer.write(0, validate(0))
    for step in range(1, int(rm.num_steps) + 1):
      t_step = time.perf_counter()
      batch = data_lib.make_batch([train[i] for i in sampler.indices(step)], pad_id, PAD_MULTIPLE)
      t0 = time.perf_counter()
      metrics = {f"train/{k}": float(v) for k, v in model.train_step(batch, loss_fn).items()}
      metrics["time/train"] = time.perf_counter() - t0
      if held_out is not None and (step % int(rm.val_period) == 0 or step == int(rm.num_steps)):
        metrics.update(validate(step))
      metrics["time/step"] = time.perf_counter() - t_step
      writer.write(step, metrics)
  finally:
    writer.close()
  model_dir = os.path.join(workdir, MODEL_DIR)
  model.save_hf(model_dir)
  path = os.path.join(workdir, "metrics.jsonl")
  if config.logging.png_curve and os.path.exists(path):
    workdir_lib.plot_curves(path, os.path.join(workdir, "curves.png"), CURVES, title=config.run.name)
  return RmResult(steps=int(rm.num_steps), last_metrics=metrics, val_history=val_history,
                  model_dir=model_dir)


CURVES = (workdir_lib.Panel("train/loss", smooth=5, also=("val/loss",)),
          workdir_lib.Panel("train/accuracy", smooth=5, also=("val/accuracy",)),
          workdir_lib.Panel("train/reward_margin", smooth=5, also=("val/reward_margin",)))
