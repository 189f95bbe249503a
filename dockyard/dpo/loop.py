"""`dpo_train`: the DPO-family training loop (DPO, cDPO, DPOP, R-DPO, IPO, SimPO, ORPO, + SFT blend).

Offline preference training through the `Policy` seam, whichever backend the policy is: per step,
`dpo.num_pairs_per_step` pairs (`data.PairSampler`) packed interleaved (`data.make_pair_batch`) ->
the frozen reference policy's logprobs of the batch (dpo / ipo only; simpo and orpo are
reference-free and skip that forward) -> `policy.train_step` with the preference loss ->
validation every `dpo.val_period` steps -> one metrics row (`train/*`, `val/*`, `time/*`) to
metrics.jsonl and TensorBoard; every `dpo.generate_period` steps (and at 0 and the end) the
generation metric when the runner gives one (`supervised.loop.GenerationMetric`: greedy pass@1 on
env.math's held-out tasks through a vLLM engine fed the policy's weights, `val/pass@1` ...). Like
`dockyard.sft.sft_loop` it is a plain `for step in ...` loop;
like the GRPO loop it resumes from `<workdir>/checkpoints/latest` (`grpo.checkpoints`) and starts
with a validation at step 0.

Validation scores the held-out pairs with `Policy.logprobs` and evaluates the NumPy spec
(`loss_spec.preference_loss`) on them: the same loss and metrics as training (`val/loss`,
`val/preference_loss`, `val/reward_accuracy`, ...), with no gradient and no backend code here.
`val/chosen_preferred` is the fraction of pairs whose chosen completion the policy itself gives
the higher sequence logprob: unlike the implicit reward's accuracy it needs no reference, and it
is not 0 at step 0 (where the DPO rewards are all 0, so no pair counts as won).
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Callable, Sequence

import numpy as np

from dockyard import console
from dockyard import workdir as workdir_lib
from dockyard.dpo import data as data_lib
from dockyard.dpo.loss_spec import PreferenceConfig, preference_loss
from dockyard.grpo import checkpoints
from dockyard.policy import LossFn, Policy, TrainBatch

PAD_MULTIPLE = 16   # batch lengths round up to this: few distinct shapes, few compilations


@dataclasses.dataclass
class DpoResult:
  steps: int                          # steps done, resumed ones included
  last_metrics: dict[str, float]
  val_history: list[dict[str, float]]
  resumed_from: int | None            # the step resumed from; None on a fresh start


class HeldOut:
  """The held-out pairs in batches of `per_batch` pairs, with the reference logprobs computed once
  (the reference is frozen); `__call__(policy)` -> the `val/*` metrics."""

  def __init__(self, pairs: Sequence[data_lib.EncodedPair], per_batch: int, pad_id: int,
               cfg: PreferenceConfig, reference: Policy | None):
    self.cfg, self.num_pairs = cfg, len(pairs)
    self.batches = [data_lib.make_pair_batch(pairs[i:i + per_batch], pad_id, PAD_MULTIPLE)
                    for i in range(0, len(pairs), per_batch)]
    for batch in self.batches:
      if cfg.needs_reference:
        batch.extras["reference_logprobs"] = reference.logprobs(batch)

  def __call__(self, policy: Policy) -> dict[str, float]:
    totals: dict[str, float] = {}
    preferred = 0
    for batch in self.batches:
      lp = policy.logprobs(batch)
      # Normalized by all the held-out pairs, so the batches' metrics add up to the whole set's.
      extras = {**batch.extras, "total_pairs": float(self.num_pairs)}
      _, metrics = preference_loss(lp, batch.loss_mask, extras, self.cfg)
      for k, v in metrics.items():
        totals[k] = totals.get(k, 0.0) + v
      seq = (lp * batch.loss_mask).sum(-1)
      preferred += int((seq[0::2] > seq[1::2]).sum())
    out = {f"val/{k}": v for k, v in totals.items()}
    out["val/chosen_preferred"] = preferred / self.num_pairs
    return out


class Validation:
  """What SFT's and DPO's loops measure at a step: `held_out()` every `val_period` steps (timed as
  time/validate) and `generation()` every `gen_period` steps (time/generate), each also at
  `num_steps` (a period of 0 or a None callable: never); `history` keeps every non-empty result."""

  def __init__(self, num_steps: int, held_out: Callable[[], dict[str, float]] | None, val_period: int,
               generation: Callable[[], dict[str, float]] | None, gen_period: int):
    self.num_steps = num_steps
    self.parts = [(fn, period, name) for fn, period, name in ((held_out, val_period, "validate"),
                                                              (generation, gen_period, "generate"))
                  if fn is not None and period > 0]
    self.history: list[dict[str, float]] = []

  def __call__(self, step: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for fn, period, name in self.parts:
      if step % period == 0 or step == self.num_steps:
        t0 = time.perf_counter()
        out.update(fn())
        out[f"time/{name}"] = time.perf_counter() - t0
    if out:
      self.history.append({"step": step, **out})
    return out


def train_batch(pairs: Sequence[data_lib.EncodedPair], pad_id: int, cfg: PreferenceConfig,
                reference: Policy | None, times: dict) -> TrainBatch:
  """The step's interleaved batch, with the reference's per-token logprobs when the mode reads them."""
  batch = data_lib.make_pair_batch(pairs, pad_id, PAD_MULTIPLE)
  if cfg.needs_reference:
    t0 = time.perf_counter()
    batch.extras["reference_logprobs"] = reference.logprobs(batch)
    times["time/reference"] = time.perf_counter() - t0
  return batch


def dpo_train(config, *, policy: Policy, reference: Policy | None, tokenizer,
              train_pairs: Sequence[data_lib.PreferencePair], val_pairs: Sequence[data_lib.PreferencePair],
              workdir: str, loss_fn: LossFn, generation: Callable[[], dict[str, float]] | None = None,
              progress: bool = True) -> DpoResult:
  """`config.dpo.num_steps` steps of the preference loss `loss_fn` (`policy_factory.
  make_preference_loss(config)`, the policy's backend); `reference` (the initial weights, frozen)
  is needed by the modes that read reference logprobs (dpo, ipo) and ignored by the others;
  `generation`, when given, returns the generation metric's `val/*` for the policy's current
  weights (a `supervised.loop.GenerationMetric`), every `dpo.generate_period` steps."""
  dpo = config.dpo
  cfg = PreferenceConfig.from_config(config.dpo)
  if cfg.needs_reference and reference is None:
    raise ValueError(f"dpo.mode={cfg.mode!r} needs a reference policy (the initial weights)")
  pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
  max_len = int(config.policy.max_seq_len)
  train = data_lib.encode_pairs(tokenizer, train_pairs, max_len)
  sampler = data_lib.PairSampler(len(train), int(dpo.num_pairs_per_step), int(config.run.seed))
  held_out = HeldOut(data_lib.encode_pairs(tokenizer, val_pairs, max_len), int(dpo.num_pairs_per_step),
                     pad_id, cfg, reference) if val_pairs and dpo.val_period > 0 else None
  num_steps, val_period, gen_period = int(dpo.num_steps), int(dpo.val_period), int(dpo.generate_period)
  ckpt_root = os.path.join(workdir, "checkpoints")
  latest = checkpoints.load_latest(ckpt_root) if config.checkpoint.enabled else None
  start = 0
  if latest is not None:
    policy.restore(latest[0])
    start = int(latest[1]["step"])
  writer = workdir_lib.MetricWriter(workdir, tensorboard=config.logging.tensorboard)
  metrics: dict[str, float] = {}
  validate = Validation(num_steps, (lambda: held_out(policy)) if held_out is not None else None, val_period,
                        generation, gen_period)

  bar = console.bar(num_steps, f"{cfg.mode} ({config.policy.backend})", initial=start, enabled=progress)
  try:
    if start == 0:
      first = validate(0)
      if first:
        writer.write(0, first)
    for step in range(start + 1, num_steps + 1):
      t_step, times = time.perf_counter(), {}
      batch = train_batch([train[i] for i in sampler.indices(step)], pad_id, cfg, reference, times)
      t0 = time.perf_counter()
      metrics = {f"train/{k}": float(v) for k, v in policy.train_step(batch, loss_fn).items()}
      times["time/train"] = time.perf_counter() - t0
      metrics.update(validate(step))
      if config.checkpoint.enabled and (step % config.checkpoint.save_period == 0 or step == num_steps):
        t0 = time.perf_counter()
        checkpoints.save_latest(ckpt_root, policy.save, {"step": step})
        times["time/checkpoint"] = time.perf_counter() - t0
      times["time/step"] = time.perf_counter() - t_step
      metrics.update(times)
      writer.write(step, metrics)
      if bar is not None:
        bar.set_postfix_str(_live_line(metrics), refresh=False)
        bar.update(1)
  finally:
    if bar is not None:
      bar.close()
    writer.close()
  plot_run(config, workdir)
  return DpoResult(steps=max(start, num_steps), last_metrics=metrics, val_history=validate.history,
                   resumed_from=start if latest is not None else None)


def _live_line(m) -> str:
  def f(key):
    v = m.get(key)
    return "-" if v is None or math.isnan(v) else f"{v:.3f}"
  return (f"loss {f('train/loss')} acc {f('train/reward_accuracy')} margin {f('train/reward_margin')}"
          f" val acc {f('val/reward_accuracy')} pass@1 {f('val/pass@1')}")


CURVES = (workdir_lib.Panel("train/preference_loss", smooth=5, also=("val/preference_loss",)),
          workdir_lib.Panel("train/reward_accuracy", smooth=5, also=("val/reward_accuracy",)),
          workdir_lib.Panel("val/chosen_preferred"),
          workdir_lib.Panel("val/pass@1", band=True),
          workdir_lib.Panel("train/reward_margin", smooth=5, also=("val/reward_margin",)),
          workdir_lib.Panel("train/sft_nll", smooth=5))


def plot_run(config, workdir: str) -> None:
  path = os.path.join(workdir, "metrics.jsonl")
  if config.logging.png_curve and os.path.exists(path):
    workdir_lib.plot_curves(path, os.path.join(workdir, "curves.png"), CURVES, title=config.run.name)
