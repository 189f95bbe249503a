"""`sft_train`: supervised fine-tuning on chat data, the run configs/sft.py launches.

The steps are `dockyard.sft.sft_loop`, the one SFT loop (the GRPO warm start runs it too); this
module feeds it and does what a run needs around it, the way `dpo.loop.dpo_train` does for the
preference loss: per step, `sft.batch_size` conversations (`dpo.data.PairSampler`'s order: a
function of (seed, step), so a resumed run draws what the uninterrupted one would have) packed
right-padded with the assistant-turn mask as the loss mask -> `policy.train_step` with the masked
NLL -> every `sft.val_period` steps the held-out loss, every `sft.generate_period` steps the
generation metric -> one metrics row (`train/*`, `val/*`, `time/*`) to metrics.jsonl and
TensorBoard. It resumes from `<workdir>/checkpoints/latest` (`grpo.checkpoints`) and validates at
step 0 on a fresh start.

  val/loss      the held-out conversations' NLL per assistant token (`Policy.logprobs`, then the
                NumPy spec `grpo.loss_spec.nll_loss`; no gradient, no backend code here)
  val/pass@1    greedy pass@1 on the env's held-out tasks through `grpo.harness.run_validation`
                (GRPO's validation path) on a vLLM engine the runner builds; `GenerationMetric`
                pushes the policy's weights into it first (`refit`, with the canary)
"""
from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import time
from typing import Any, Callable, Mapping, Sequence

from dockyard import console
from dockyard import workdir as workdir_lib
from dockyard.conversation import EncodedConversation
from dockyard.dpo.data import PairSampler
from dockyard.dpo.loop import Validation
from dockyard.grpo import checkpoints
from dockyard.grpo.harness import run_validation
from dockyard.grpo.loss_spec import nll_loss
from dockyard.policy import LossFn, Policy
from dockyard.refit.synchronizer import WeightSynchronizer
from dockyard.rollout.base import Generator, SamplingParams
from dockyard.sft import sft_loop
from dockyard.supervised import data as data_lib

PAD_MULTIPLE = 16   # batch lengths round up to this: few distinct shapes, few compilations


@dataclasses.dataclass
class SftResult:
  steps: int                          # steps done, resumed ones included
  last_metrics: dict[str, float]
  val_history: list[dict[str, float]]
  resumed_from: int | None            # the step resumed from; None on a fresh start


class HeldOutLoss:
  """The held-out conversations in batches; `__call__(policy)` -> val/loss (NLL per assistant
  token over all of them) and val/tokens."""

  def __init__(self, conversations: Sequence[EncodedConversation], per_batch: int, pad_id: int):
    self.batches = [data_lib.make_batch(conversations[i:i + per_batch], pad_id, PAD_MULTIPLE)
                    for i in range(0, len(conversations), per_batch)]
    self.tokens = float(sum(b.loss_mask.sum() for b in self.batches))

  def __call__(self, policy: Policy) -> dict[str, float]:
    # Each batch normalized by all the held-out tokens, so the batches' losses add up to the set's.
    loss = sum(nll_loss(policy.logprobs(b), b.loss_mask, {"total_tokens": self.tokens})[0]
               for b in self.batches)
    return {"val/loss": loss, "val/tokens": self.tokens}


class GenerationMetric:
  """Greedy pass@1 on held-out env tasks: the policy's weights go to the engine (`synchronizer`,
  in process), then `run_validation` samples one completion per task and the env scores it."""

  def __init__(self, synchronizer: WeightSynchronizer, generator: Generator, env, tokenizer,
               tasks: Sequence[Mapping[str, Any]], sampling: SamplingParams):
    if not tasks:
      raise ValueError("the generation metric has no held-out tasks")
    self.synchronizer, self.generator, self.env, self.tokenizer = synchronizer, generator, env, tokenizer
    self.tasks, self.sampling = list(tasks), sampling
    self.loop = asyncio.new_event_loop()

  def __call__(self) -> dict[str, float]:
    out = {k: v for k, v in self.synchronizer.refit().items() if k.startswith("refit/canary/")}
    out.update(run_validation(self.generator, self.env, self.tokenizer, self.tasks, self.sampling, self.loop))
    return out

  def close(self) -> None:
    self.loop.close()


def sft_train(config, *, policy: Policy, tokenizer, train: Sequence[data_lib.Conversation],
              validation: Sequence[data_lib.Conversation], workdir: str, loss_fn: LossFn,
              generation: Callable[[], dict[str, float]] | None = None, progress: bool = True) -> SftResult:
  """`config.sft.num_steps` steps of `loss_fn` (the backend's masked NLL, `policy_factory.
  make_loss(config, 'nll')`); `generation`, when given, returns the generation metric's `val/*`
  for the policy's current weights (a `GenerationMetric`)."""
  sft = config.sft
  num_steps, val_period, gen_period = int(sft.num_steps), int(sft.val_period), int(sft.generate_period)
  pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
  max_len = int(config.policy.max_seq_len)
  encoded = data_lib.encode_conversations(tokenizer, train, max_len)
  if not encoded:
    raise ValueError("no training conversations")
  sampler = PairSampler(len(encoded), int(sft.batch_size), int(config.run.seed))
  held_out = (HeldOutLoss(data_lib.encode_conversations(tokenizer, validation, max_len), int(sft.batch_size),
                          pad_id) if validation and val_period > 0 else None)
  ckpt_root = os.path.join(workdir, "checkpoints")
  latest = checkpoints.load_latest(ckpt_root) if config.checkpoint.enabled else None
  start = 0
  if latest is not None:
    policy.restore(latest[0])
    start = int(latest[1]["step"])
  writer = workdir_lib.MetricWriter(workdir, tensorboard=config.logging.tensorboard)
  last: dict[str, float] = {}
  validate = Validation(num_steps, (lambda: held_out(policy)) if held_out is not None else None, val_period,
                        generation, gen_period)

  def batch(step: int):
    return data_lib.make_batch([encoded[i] for i in sampler.indices(step)], pad_id, PAD_MULTIPLE)

  bar = console.bar(num_steps, f"sft ({config.policy.backend})", initial=start, enabled=progress)

  def on_step(step: int, metrics: dict[str, float], seconds: float) -> None:
    row = {f"train/{k}": v for k, v in metrics.items()}
    row["time/train"] = seconds
    row.update(validate(step))
    if config.checkpoint.enabled and (step % config.checkpoint.save_period == 0 or step == num_steps):
      t0 = time.perf_counter()
      checkpoints.save_latest(ckpt_root, policy.save, {"step": step})
      row["time/checkpoint"] = time.perf_counter() - t0
    writer.write(step, row)
    last.clear()
    last.update(row)
    if bar is not None:
      bar.set_postfix_str(_live_line(row), refresh=False)
      bar.update(1)

  try:
    if start == 0:
      first = validate(0)
      if first:
        writer.write(0, first)
    steps = range(start + 1, num_steps + 1)
    sft_loop(policy, (batch(step) for step in steps), steps, loss_fn, on_step=on_step)
  finally:
    if bar is not None:
      bar.close()
    writer.close()
  plot_run(config, workdir)
  return SftResult(steps=max(start, num_steps), last_metrics=dict(last), val_history=validate.history,
                   resumed_from=start if latest is not None else None)


def _live_line(m) -> str:
  def f(key):
    v = m.get(key)
    return "-" if v is None or math.isnan(v) else f"{v:.3f}"
  return f"loss {f('train/loss')} val loss {f('val/loss')} pass@1 {f('val/pass@1')}"


CURVES = (workdir_lib.Panel("train/loss", smooth=5, also=("val/loss",)),
          workdir_lib.Panel("val/pass@1", band=True))


def plot_run(config, workdir: str) -> None:
  path = os.path.join(workdir, "metrics.jsonl")
  if config.logging.png_curve and os.path.exists(path):
    workdir_lib.plot_curves(path, os.path.join(workdir, "curves.png"), CURVES, title=config.run.name)
