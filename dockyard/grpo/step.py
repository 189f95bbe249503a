"""The pieces of one GRPO step, shared by every trajectory source and by `loop.grpo_train`.

A step: sample prompts (`PromptSampler`) -> `collect_groups` (Generator: n completions per
prompt) -> `score_groups` (Environment, many scorings in flight on one asyncio loop) ->
`assign_advantages` (shaping, estimator, zero-variance groups reported / dropped) ->
`update_policy` (recompute prev (and reference) logprobs, `Policy.train_step` with the
clipped-PG loss per minibatch) -> `refit` (the synchronizer's `refit()`: push, canary, engines
ready). Which of these a step runs itself and which arrive done (generation
and scoring, in the async source) is the trajectory source's business (`dockyard.grpo.source`).

Nothing here knows a backend or engine: the `Policy` / `Generator` seams, a weight synchronizer
(`dockyard.refit.synchronizer.WeightSynchronizer`: `refit() -> metrics`, `version`) and a `LossFn` the caller chose for the policy's backend.
"""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from dockyard.grpo.advantages import compute_advantages
from dockyard.grpo.batch import Group, make_train_batch
from dockyard.rollout.chat import decode, encode_prompt
from dockyard.grpo.shaping import ShapingConfig, shape_reward
from dockyard.policy import LossFn, Policy, TrainBatch
from dockyard.rollout.base import Completion, Generator, SamplingParams

# Rows are padded to a multiple of this many tokens so the trainer compiles few distinct shapes.
PAD_MULTIPLE = 16


class PromptSampler:
  """Deterministic epochs over the training tasks: a fresh seeded permutation per epoch."""

  def __init__(self, tasks: Sequence[Mapping[str, Any]], seed: int = 0):
    if not tasks:
      raise ValueError("no training tasks to sample prompts from")
    self.tasks, self.seed = list(tasks), int(seed)
    self.epoch, self.pos = 0, 0

  def _order(self) -> np.ndarray:
    return np.random.default_rng([self.seed, self.epoch]).permutation(len(self.tasks))

  def next(self, k: int) -> list[Mapping[str, Any]]:
    out = []
    while len(out) < k:
      order = self._order()
      take = order[self.pos:self.pos + k - len(out)]
      out.extend(self.tasks[i] for i in take)
      self.pos += len(take)
      if self.pos >= len(self.tasks):
        self.epoch, self.pos = self.epoch + 1, 0
    return out

  def state(self) -> dict:
    return dict(epoch=self.epoch, pos=self.pos)

  def load(self, state: Mapping[str, int]) -> None:
    self.epoch, self.pos = int(state["epoch"]), int(state["pos"])


def collect_groups(generator: Generator, env, tokenizer, tasks: Sequence[Mapping[str, Any]], n: int,
                   sampling: SamplingParams) -> list[Group]:
  """Generates `n` completions per task; returns unscored groups."""
  prompts = [encode_prompt(tokenizer, env.prompt_messages(t)) for t in tasks]
  outs = generator.generate(prompts, n, sampling)
  if len(outs) != len(tasks) or any(len(o) != n for o in outs):
    raise RuntimeError(f"generator returned {[len(o) for o in outs]} completions for {len(tasks)} "
                       f"prompts x n={n}")
  return [Group(task=t, prompt_ids=p, completions=list(o), texts=[decode(tokenizer, c) for c in o])
          for t, p, o in zip(tasks, prompts, outs)]


async def score_groups(env, groups: Sequence[Group], max_in_flight: int = 64) -> None:
  """Fills `group.rewards`, with up to `max_in_flight` scorings awaiting at once."""
  sem = asyncio.Semaphore(max(1, max_in_flight))

  async def one(task, text):
    async with sem:
      return await env.score(task, text)

  results = await asyncio.gather(*[one(g.task, t) for g in groups for t in g.texts])
  i = 0
  for g in groups:
    g.rewards = list(results[i:i + g.size])
    i += g.size


def assign_advantages(groups: Sequence[Group], config) -> tuple[list[Group], dict[str, float]]:
  """Shapes rewards and sets advantages; returns (groups to train on, stats)."""
  shaping = ShapingConfig.from_config(config)
  adv_cfg = config.grpo.advantage
  raw = np.array([[r.value for r in g.rewards] for g in groups], np.float64)
  shaped = np.array([[shape_reward(r.value, r.malformed, len(c.token_ids), shaping)
                      for r, c in zip(g.rewards, g.completions)] for g in groups], np.float64)
  components = None
  names = sorted({k for g in groups for r in g.rewards for k in r.components})
  if names:
    components = {k: [[r.components.get(k, 0.0) for r in g.rewards] for g in groups] for k in names}
    penalty = shaped - shaping.scale * raw
    if np.any(penalty != 0):   # shaping is one more reward for GDPO to normalize
      components["shaping"] = penalty
  adv = compute_advantages(shaped, adv_cfg.estimator, leave_one_out=adv_cfg.leave_one_out,
                           normalize_std=adv_cfg.normalize_std, components=components)
  for g, s, a in zip(groups, shaped, adv.values):
    g.shaped, g.advantages = s.astype(np.float32), a
  drop = adv.zero_variance if config.grpo.dynamic_sampling else np.zeros(len(groups), bool)
  kept = [g for g, d in zip(groups, drop) if not d]
  stats = {
      "reward/raw_mean": float(raw.mean()), "reward/raw_std": float(raw.std()),
      "reward/shaped_mean": float(shaped.mean()), "reward/shaped_std": float(shaped.std()),
      "reward/malformed_fraction": float(np.mean([r.malformed for g in groups for r in g.rewards])),
      "groups/zero_variance_fraction": adv.zero_variance_fraction,
      "groups/kept": float(len(kept)),
      "advantages/abs_mean": float(np.abs(adv.values).mean()),
  }
  return kept, stats


def rollout_stats(groups: Sequence[Group], generate_s: float) -> dict[str, float]:
  completions = [c for g in groups for c in g.completions]
  lengths = np.array([len(c.token_ids) for c in completions], np.float64)
  # a multi-turn episode's logprobs are 0.0 on its tool results: only its trained tokens count
  lps = np.concatenate([np.asarray(c.logprobs, np.float64)[np.asarray(c.loss_mask, bool)]
                        if c.loss_mask is not None else np.asarray(c.logprobs, np.float64)
                        for c in completions] or [np.zeros(0)])
  return {
      "rollout/completion_len_mean": float(lengths.mean()),
      "rollout/completion_len_max": float(lengths.max()),
      "rollout/truncated_fraction": float(np.mean([c.finish_reason == "length" for c in completions])),
      # -mean log p of the sampled tokens: a one-sample estimate of the per-token entropy.
      "rollout/entropy_approx": float(-lps.mean()) if lps.size else float("nan"),
      "perf/tokens_per_s": float(lengths.sum() / generate_s) if generate_s > 0 else float("nan"),
  }


def split_rows(batch: TrainBatch, parts: int) -> list[TrainBatch]:
  """`parts` contiguous row slices of a batch (extras sliced along their first axis)."""
  bounds = np.linspace(0, batch.batch_size, min(parts, batch.batch_size) + 1).astype(int)
  return [TrainBatch(batch.input_ids[a:b], batch.attention_mask[a:b], batch.loss_mask[a:b],
                     {k: v[a:b] for k, v in batch.extras.items()}, batch.temperature)
          for a, b in zip(bounds[:-1], bounds[1:])]


def train_on_groups(policy: Policy, groups: Sequence[Group], loss_fn: LossFn, *, pad_id: int,
                    kl_coef: float = 0.0, reference: Policy | None = None,
                    pad_multiple: int = PAD_MULTIPLE,
                    num_minibatches: int = 1, temperature: float = 1.0,
                    extras_fn: Callable[[TrainBatch], tuple[dict, dict]] | None = None,
                    ) -> dict[str, float]:
  """Packs the groups, then takes one optimizer step per minibatch (`num_minibatches` row slices;
  metrics are their mean, `lr` the last). prev logprobs (the policy before this update) are
  recomputed in a separate forward pass only where later minibatches need them (the policy has
  moved by then); with one minibatch the loss takes prev as its own logprobs detached
  (`loss_spec`), the same numbers without the pass. Reference logprobs (KL) are one forward pass
  of `reference`. `temperature`: what the groups were sampled at; prev, reference and trained
  logprobs are all of softmax(logits / T), the distribution the engine's generation logprobs
  describe. `extras_fn(batch) -> (extras, metrics)`, when given, runs once the batch holds its
  prev (if computed) and reference logprobs; its extras are set on the batch (replacing any of the
  same name: e.g. on-policy distillation's per-token advantages, or the teachers' top-k)."""
  batch = make_train_batch(groups, pad_id, pad_multiple, temperature)
  m = batch.loss_mask
  if num_minibatches > 1:
    # the policy as it is before this update, so every minibatch's ratio is against it
    batch.extras["prev_logprobs"] = np.asarray(policy.logprobs(batch), np.float32) * m
  if kl_coef != 0:
    if reference is None:
      raise ValueError("loss_fn.reference_policy_kl_penalty != 0 needs a reference policy; pass "
                       "reference=... or set the penalty to 0")
    batch.extras["reference_logprobs"] = np.asarray(reference.logprobs(batch), np.float32) * m
  metrics = {}
  if extras_fn is not None:
    extras, extra_metrics = extras_fn(batch)
    batch.extras.update(extras)
    metrics.update(extra_metrics)
  steps = [policy.train_step(mb, loss_fn) for mb in split_rows(batch, num_minibatches)]
  for k in steps[0]:
    metrics[f"train/{k}"] = float(steps[-1][k] if k == "lr" else np.mean([float(s[k]) for s in steps]))
  metrics["train/minibatches"] = float(len(steps))
  metrics["train/sequences"] = float(batch.batch_size)
  metrics["train/tokens"] = float(m.sum())
  return metrics


def update_policy(policy: Policy, groups: Sequence[Group], settings, reference: Policy | None) -> dict[str, float]:
  """One GRPO update on the kept groups with the run's settings (`harness.RunSettings`: loss,
  KL coefficient, padding, minibatches, the sampling temperature)."""
  return train_on_groups(policy, groups, settings.update_loss, pad_id=settings.pad_id, kl_coef=settings.kl_coef,
                         reference=reference, num_minibatches=settings.num_minibatches,
                         temperature=settings.sampling.temperature)


@dataclasses.dataclass(frozen=True)
class Update:
  """What the loop does with a step's kept groups: `fn(policy, groups, settings, reference) ->
  metrics` (`settings`: `harness.RunSettings`, whose `update_loss` is this update's loss);
  `reads_reference`: fn reads the reference policy, which the loop then builds as the KL penalty's
  (the policy after the SFT warm start); `name` for the plan and logs."""
  fn: Callable[..., dict[str, float]]
  reads_reference: bool = False
  name: str = "policy_gradient"


POLICY_GRADIENT = Update(update_policy)   # GRPO's clipped policy-gradient step (grpo.objective default)


def refit(synchronizer) -> dict[str, float]:
  """Trainer -> engine: the weights pushed, checked and the engines readied; sync metrics."""
  sync_metrics = synchronizer.refit() or {}
  out = {}
  for k, v in sync_metrics.items():
    if isinstance(v, (int, float, np.number)) and not isinstance(v, bool):
      out[k if k.startswith("refit/") else f"refit/{k}"] = float(v)   # WeightSynchronizer prefixes
  return out
