"""The synchronous GRPO loop, `grpo_train`, composed from step pieces the async loop reuses.

One step: sample prompts -> `collect_groups` (Generator: n completions per prompt) ->
`score_groups` (Environment, many scorings in flight on one asyncio loop) -> `assign_advantages`
(shaping, estimator, zero-variance groups reported / dropped) -> `train_on_groups` (recompute
prev (and reference) logprobs, `Policy.train_step` with the clipped-PG loss) -> `refit`
(`mark_stale` -> `sync_weights` -> `prepare_for_generation`) -> log, validate, checkpoint.

The loop knows no backend or engine: it drives the `Policy` / `Generator` seams and a weight
synchronizer (`dockyard.refit.synchronizer.WeightSynchronizer`: `mark_stale()`,
`sync_weights() -> metrics`, `prepare_for_generation()`, `version`). The loss matching the
policy's backend comes from `make_losses(config)`.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from dockyard import estimators
from dockyard import workdir as workdir_lib
from dockyard.grpo import checkpoints
from dockyard.grpo.advantages import compute_advantages
from dockyard.grpo.batch import Group, encode_prompt, make_train_batch
from dockyard.grpo.loss_spec import LossConfig
from dockyard.grpo.sft import sft_warmup
from dockyard.grpo.shaping import ShapingConfig, shape_reward
from dockyard.policy import LossFn, Policy, TrainBatch
from dockyard.rollout.base import Completion, Generator, SamplingParams

log = logging.getLogger(__name__)
VAL_SAMPLES = "val_samples.jsonl"   # in the workdir: each validation's completions, one JSON per task

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


def _decode(tokenizer, c: Completion) -> str:
  return c.text if c.text else tokenizer.decode(c.token_ids, skip_special_tokens=True)


def collect_groups(generator: Generator, env, tokenizer, tasks: Sequence[Mapping[str, Any]], n: int,
                   sampling: SamplingParams) -> list[Group]:
  """Generates `n` completions per task; returns unscored groups."""
  prompts = [encode_prompt(tokenizer, env.prompt_messages(t)) for t in tasks]
  outs = generator.generate(prompts, n, sampling)
  if len(outs) != len(tasks) or any(len(o) != n for o in outs):
    raise RuntimeError(f"generator returned {[len(o) for o in outs]} completions for {len(tasks)} "
                       f"prompts x n={n}")
  return [Group(task=t, prompt_ids=p, completions=list(o), texts=[_decode(tokenizer, c) for c in o])
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
  lps = np.concatenate([np.asarray(c.logprobs, np.float64) for c in completions] or [np.zeros(0)])
  return {
      "rollout/completion_len_mean": float(lengths.mean()),
      "rollout/completion_len_max": float(lengths.max()),
      "rollout/truncated_fraction": float(np.mean([c.finish_reason == "length" for c in completions])),
      # -mean log p of the sampled tokens: a one-sample estimate of the per-token entropy.
      "rollout/entropy_approx": float(-lps.mean()) if lps.size else float("nan"),
      "perf/tokens_per_s": float(lengths.sum() / generate_s) if generate_s > 0 else float("nan"),
  }


def importance_stats(prev: np.ndarray, gen: np.ndarray, mask: np.ndarray, cap: float | None) -> dict:
  """Trainer-vs-sampler mismatch: exp(prev - generation) over the loss tokens."""
  diff = (prev - gen)[mask > 0].astype(np.float64)
  if diff.size == 0:
    return {}
  ratio = np.exp(diff)
  out = {"is/ratio_mean": float(ratio.mean()), "is/ratio_min": float(ratio.min()),
         "is/ratio_max": float(ratio.max()), "is/logprob_abs_diff_mean": float(np.abs(diff).mean())}
  if cap:
    out["is/truncated_fraction"] = float((ratio > cap).mean())
  return out


def split_rows(batch: TrainBatch, parts: int) -> list[TrainBatch]:
  """`parts` contiguous row slices of a batch (extras sliced along their first axis)."""
  bounds = np.linspace(0, batch.batch_size, min(parts, batch.batch_size) + 1).astype(int)
  return [TrainBatch(batch.input_ids[a:b], batch.attention_mask[a:b], batch.loss_mask[a:b],
                     {k: v[a:b] for k, v in batch.extras.items()}, batch.temperature)
          for a, b in zip(bounds[:-1], bounds[1:])]


def train_on_groups(policy: Policy, groups: Sequence[Group], loss_fn: LossFn, *, pad_id: int,
                    kl_coef: float = 0.0, reference: Policy | None = None,
                    is_cap: float | None = None, pad_multiple: int = PAD_MULTIPLE,
                    num_minibatches: int = 1, temperature: float = 1.0) -> dict[str, float]:
  """Packs the groups, recomputes prev (and reference) logprobs once, then takes one optimizer
  step per minibatch (`num_minibatches` row slices; metrics are their mean, `lr` the last).
  `temperature`: what the groups were sampled at; prev, reference and trained logprobs are all
  of softmax(logits / T), the distribution the engine's generation logprobs describe."""
  batch = make_train_batch(groups, pad_id, pad_multiple, temperature)
  m = batch.loss_mask
  # prev_logprobs: the policy as it is before this step, so the ratio starts at exactly 1.
  batch.extras["prev_logprobs"] = np.asarray(policy.logprobs(batch), np.float32) * m
  if kl_coef != 0:
    if reference is None:
      raise ValueError("loss_fn.reference_policy_kl_penalty != 0 needs a reference policy; pass "
                       "reference=... or set the penalty to 0")
    batch.extras["reference_logprobs"] = np.asarray(reference.logprobs(batch), np.float32) * m
  metrics = importance_stats(batch.extras["prev_logprobs"], batch.extras["generation_logprobs"], m, is_cap)
  steps = [policy.train_step(mb, loss_fn) for mb in split_rows(batch, num_minibatches)]
  for k in steps[0]:
    metrics[f"train/{k}"] = float(steps[-1][k] if k == "lr" else np.mean([float(s[k]) for s in steps]))
  metrics["train/minibatches"] = float(len(steps))
  metrics["train/sequences"] = float(batch.batch_size)
  metrics["train/tokens"] = float(m.sum())
  return metrics


def refit(synchronizer) -> dict[str, float]:
  """Trainer -> engine: mark stale, move the weights, make the engine ready; sync metrics."""
  synchronizer.mark_stale()
  sync_metrics = synchronizer.sync_weights() or {}
  synchronizer.prepare_for_generation()
  out = {}
  for k, v in sync_metrics.items():
    if isinstance(v, (int, float, np.number)) and not isinstance(v, bool):
      out[k if k.startswith("refit/") else f"refit/{k}"] = float(v)   # WeightSynchronizer prefixes
  return out


def success_of(env) -> Callable[[Any], bool]:
  """The env's "this completion solves the task" test (reward >= 1 for envs without one)."""
  return getattr(env, "is_success", None) or (lambda r: r.value >= 1.0)


def pass_at_1_metrics(env, rewards: Sequence[Any]) -> dict[str, float]:
  """val/pass@1 of one sample per task (greedy at val_temperature 0) and its 95% Wilson interval."""
  ok = success_of(env)
  wins = sum(bool(ok(r)) for r in rewards)
  lo, hi = estimators.wilson_interval(wins, len(rewards))
  return {"val/pass@1": wins / max(len(rewards), 1), "val/pass@1_ci95_lo": lo, "val/pass@1_ci95_hi": hi}


def run_validation(generator: Generator, env, tokenizer, tasks: Sequence[Mapping[str, Any]],
                   sampling: SamplingParams, loop: asyncio.AbstractEventLoop | Callable,
                   max_in_flight: int = 64, samples: list | None = None) -> dict[str, float]:
  """One completion per held-out task at the validation temperature; `val/*` metrics.

  `loop` runs the scoring coroutine: an event loop, or a callable taking the coroutine (the async
  loop scores on its collector's event loop, where the env's clients live). `samples`, when
  given, receives one record per task: instance id, completion text, reward, malformed, reason.
  """
  groups = collect_groups(generator, env, tokenizer, tasks, 1, sampling)
  run = loop if callable(loop) else loop.run_until_complete
  run(score_groups(env, groups, max_in_flight))
  rewards = [g.rewards[0] for g in groups]
  if samples is not None:
    for g, r in zip(groups, rewards):
      samples.append(dict(instance_id=str(g.task.get("instance_id", "")), completion=g.texts[0],
                          reward=float(r.value), success=bool(success_of(env)(r)), malformed=bool(r.malformed),
                          reason=str(r.info.get("reason", ""))))
  out = {"val/reward_mean": float(np.mean([r.value for r in rewards])),
         "val/malformed_fraction": float(np.mean([r.malformed for r in rewards])),
         "val/completion_len_mean": float(np.mean([len(g.completions[0].token_ids) for g in groups]))}
  out.update(pass_at_1_metrics(env, rewards))
  if hasattr(env, "validation_metrics"):
    out.update({f"val/{k}": float(v) for k, v in env.validation_metrics(rewards).items()})
  return out


def make_losses(config) -> tuple[LossFn, LossFn]:
  """(clipped-PG loss, SFT NLL loss) in the array type of `config.policy.backend`."""
  from dockyard import policy_factory
  return policy_factory.make_loss(config, "pg"), policy_factory.make_loss(config, "nll")


@contextlib.contextmanager
def _timed(times: dict, key: str):
  t0 = time.perf_counter()
  try:
    yield
  finally:
    times[f"time/{key}"] = times.get(f"time/{key}", 0.0) + time.perf_counter() - t0


def _live_line(step: int, m: Mapping[str, float]) -> str:
  def f(key, fmt="{:.3f}"):
    v = m.get(key)
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)
  return (f"step {step} reward {f('reward/raw_mean')} zero-var {f('groups/zero_variance_fraction', '{:.2f}')} "
          f"clip {f('train/clip_fraction')} len {f('rollout/completion_len_mean', '{:.1f}')} "
          f"gen {f('time/generate', '{:.1f}')}s train {f('time/train', '{:.1f}')}s "
          f"refit {f('time/refit', '{:.1f}')}s")


@dataclasses.dataclass
class TrainResult:
  steps: int                        # GRPO steps done (including resumed ones)
  last_metrics: dict[str, float]
  val_history: list[dict[str, float]]
  best: dict | None                 # best-k entry {step, value, path} or None
  resumed_from: int | None          # the step resumed from, None on a fresh start


@dataclasses.dataclass
class RunSettings:
  """What both loops derive from the config before the first step."""
  pg_loss: LossFn
  nll: LossFn
  kl_coef: float
  is_cap: float | None
  pad_id: int
  max_in_flight: int
  sampling: SamplingParams
  val_sampling: SamplingParams
  num_minibatches: int = 1

  @classmethod
  def build(cls, config, tokenizer, reference: Policy | Callable[[], Policy] | None = None,
            losses: tuple[LossFn, LossFn] | None = None) -> "RunSettings":
    pg_loss, nll = losses or make_losses(config)
    kl_coef = float(config.loss_fn.reference_policy_kl_penalty)
    if kl_coef != 0 and reference is None:
      raise ValueError("loss_fn.reference_policy_kl_penalty != 0 needs a reference policy "
                       "(reference=a Policy, or a callable that builds one from the initial checkpoint)")
    is_cap = (float(config.loss_fn.truncated_importance_sampling_ratio)
              if config.loss_fn.use_importance_sampling_correction else None)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    r = config.rollout
    return cls(pg_loss=pg_loss, nll=nll, kl_coef=kl_coef, is_cap=is_cap, pad_id=pad_id,
               max_in_flight=int(config.env.code.max_in_flight) if "code" in config.env else 64,
               sampling=SamplingParams(temperature=r.temperature, top_p=r.top_p, max_tokens=r.max_new_tokens),
               val_sampling=SamplingParams(temperature=r.val_temperature, top_p=1.0,
                                           max_tokens=r.max_new_tokens, seed=config.run.seed),
               num_minibatches=int(config.grpo.num_minibatches))

  def train(self, policy: Policy, groups: Sequence[Group], reference: Policy | None) -> dict[str, float]:
    return train_on_groups(policy, groups, self.pg_loss, pad_id=self.pad_id, kl_coef=self.kl_coef,
                           reference=reference, is_cap=self.is_cap, num_minibatches=self.num_minibatches,
                           temperature=self.sampling.temperature)


class Validator:
  """Validation every `val_period` steps and the best-k checkpoints it feeds."""

  def __init__(self, config, policy: Policy, generator: Generator, env, tokenizer,
               val_tasks: Sequence[Mapping[str, Any]], settings: RunSettings, ckpt_root: str, run_coro,
               samples_path: str | None = None):
    self.samples_path = samples_path   # val_samples.jsonl: every validation's completions, by step
    self.config, self.policy, self.generator, self.env, self.tokenizer = config, policy, generator, env, tokenizer
    self.tasks = list(val_tasks)[:config.grpo.max_val_samples]
    self.settings, self.run_coro = settings, run_coro
    ck = config.checkpoint
    self.best = checkpoints.BestK(ckpt_root, ck.keep_top_k, ck.metric_mode)
    self.history: list[dict] = []

  def due(self, step: int) -> bool:
    p = self.config.grpo.val_period
    return bool(self.tasks) and p > 0 and step % p == 0

  def __call__(self, step: int) -> dict:
    ck, times = self.config.checkpoint, {}
    samples: list[dict] = []
    with _timed(times, "validate"):
      val = run_validation(self.generator, self.env, self.tokenizer, self.tasks, self.settings.val_sampling,
                           self.run_coro, self.settings.max_in_flight, samples=samples)
    if self.samples_path:
      workdir_lib.append_jsonl(self.samples_path, ({"step": step, **rec} for rec in samples))
    val.update(times)
    self.history.append({"step": step, **val})
    if ck.enabled:
      if ck.metric not in val:
        raise ValueError(f"config.checkpoint.metric {ck.metric!r} is not a validation metric of "
                         f"env {self.config.env.name!r}; it reports {sorted(val)}")
      val["checkpoint/saved_best"] = float(self.best.offer(step, val[ck.metric], self.policy.save))
    return val


REFERENCE_DIR = "reference"   # under checkpoints/: the KL reference's weights (the policy after the warm start)


def resolve_reference(config, policy: Policy, reference: Policy | Callable[[], Policy] | None,
                      ckpt_root: str, warm_started: bool) -> Policy | None:
  """The reference policy of the KL penalty, or None when the penalty is 0.

  `reference` is a Policy (used as is) or a callable building one from the initial checkpoint.
  The reference is the policy GRPO starts from: after an SFT warm start, its weights are saved to
  checkpoints/reference/ (through `Policy.save`) and loaded into the built one, also on resume.
  """
  if float(config.loss_fn.reference_policy_kl_penalty) == 0 or reference is None:
    return None
  if not callable(reference) or isinstance(reference, Policy):
    return reference
  snapshot = os.path.join(ckpt_root, REFERENCE_DIR)
  if warm_started and not os.path.isdir(snapshot):
    policy.save(snapshot)
  built = reference()
  if os.path.isdir(snapshot):
    built.restore(snapshot)
  return built


def start_run(config, *, policy: Policy, synchronizer, env, tokenizer, train_tasks, writer, nll: LossFn,
              ckpt_root: str) -> tuple[int, dict | None]:
  """Resumes from ckpt_root/latest or warm-starts with SFT, then refits the engine if the policy
  changed; returns (start step, the resumed loop_state or None)."""
  g = config.grpo
  latest = checkpoints.load_latest(ckpt_root) if config.checkpoint.enabled else None
  if latest is not None:
    path, state = latest
    policy.restore(path)
    log.info("resumed from %s at step %d", path, int(state["step"]))
  elif g.sft_warmup.steps > 0:
    sw = g.sft_warmup
    sft_warmup(policy, env, tokenizer, train_tasks, steps=sw.steps, batch_size=sw.batch_size, lr=sw.lr,
               loss_fn=nll, seed=config.run.seed, pad_multiple=PAD_MULTIPLE,
               on_step=lambda i, m: writer.write(i, {f"sft/{k}": v for k, v in m.items()}))
  if latest is not None or g.sft_warmup.steps > 0:
    refit(synchronizer)   # the engine still holds the initial weights
  return (int(latest[1]["step"]), latest[1]) if latest is not None else (0, None)


class Progress:
  """A tqdm bar (or log lines) with the live step summary."""

  def __init__(self, enabled: bool, total: int, initial: int, desc: str):
    self.bar = None
    if enabled:
      from tqdm import tqdm
      self.bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True)

  def update(self, step: int, metrics: Mapping[str, float]) -> None:
    line = _live_line(step, metrics)
    if self.bar is None:
      log.info(line)
    else:
      self.bar.set_postfix_str(line.split(" ", 2)[2], refresh=False)
      self.bar.update(1)

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()


def finish_run(config, workdir: str, start: int, metrics: dict, validator, *, resumed: bool) -> "TrainResult":
  """The end of a run, sync or async: the curves PNG and the result the runner reports."""
  plot_run(config, workdir)
  return TrainResult(steps=max(start, int(config.grpo.max_num_steps)), last_metrics=metrics,
                     val_history=validator.history, best=validator.best.best,
                     resumed_from=start if resumed else None)


def plot_run(config, workdir: str) -> None:
  if config.logging.png_curve and os.path.exists(os.path.join(workdir, "metrics.jsonl")):
    workdir_lib.plot_curves(os.path.join(workdir, "metrics.jsonl"), os.path.join(workdir, "curves.png"),
                            ("reward/raw_mean", config.checkpoint.metric, "groups/zero_variance_fraction",
                             "train/clip_fraction", "rollout/completion_len_mean"),
                            title=config.run.name)


def grpo_train(config, *, policy: Policy, generator: Generator, synchronizer, env, tokenizer,
               train_tasks: Sequence[Mapping[str, Any]], val_tasks: Sequence[Mapping[str, Any]],
               workdir: str, reference: Policy | Callable[[], Policy] | None = None,
               losses: tuple[LossFn, LossFn] | None = None, progress: bool = True) -> TrainResult:
  """Synchronous GRPO for `config.grpo.max_num_steps` steps; resumes from workdir/checkpoints.
  `reference` (needed when the KL penalty is on): see `resolve_reference`."""
  g, ck = config.grpo, config.checkpoint
  settings = RunSettings.build(config, tokenizer, reference, losses)
  sampling = settings.sampling
  ckpt_root = os.path.join(workdir, "checkpoints")
  os.makedirs(ckpt_root, exist_ok=True)
  sampler = PromptSampler(train_tasks, seed=config.data.shuffle_seed)
  writer = workdir_lib.MetricWriter(workdir, tensorboard=config.logging.tensorboard)
  loop = asyncio.new_event_loop()
  validator = Validator(config, policy, generator, env, tokenizer, val_tasks, settings, ckpt_root,
                        loop.run_until_complete, samples_path=os.path.join(workdir, VAL_SAMPLES))
  metrics: dict[str, float] = {}

  try:
    start, state = start_run(config, policy=policy, synchronizer=synchronizer, env=env, tokenizer=tokenizer,
                             train_tasks=train_tasks, writer=writer, nll=settings.nll, ckpt_root=ckpt_root)
    reference = resolve_reference(config, policy, reference, ckpt_root,
                                  warm_started=g.sft_warmup.steps > 0)
    if state is not None:
      sampler.load(state["sampler"])
    if g.val_at_start and start == 0 and validator.tasks:
      writer.write(0, validator(0))

    bar = Progress(progress, g.max_num_steps, start, "grpo")
    for step in range(start + 1, g.max_num_steps + 1):
      times: dict[str, float] = {}
      t_step = time.perf_counter()
      tasks = sampler.next(g.num_prompts_per_step)
      sampling.seed = config.run.seed * 1_000_003 + step   # reproducible samples per step
      with _timed(times, "generate"):
        groups = collect_groups(generator, env, tokenizer, tasks, g.num_generations_per_prompt, sampling)
      with _timed(times, "score"):
        loop.run_until_complete(score_groups(env, groups, settings.max_in_flight))
      kept, metrics = assign_advantages(groups, config)
      metrics.update(rollout_stats(groups, times["time/generate"]))
      if kept:
        with _timed(times, "train"):
          metrics.update(settings.train(policy, kept, reference))
        with _timed(times, "refit"):
          metrics.update(refit(synchronizer))
      else:   # every group was flat and dynamic sampling dropped them all: nothing to learn
        metrics["train/skipped"] = 1.0
      metrics["weight_version"] = float(synchronizer.version)
      if validator.due(step):
        metrics.update(validator(step))
      if ck.enabled and (step % ck.save_period == 0 or step == g.max_num_steps):
        with _timed(times, "checkpoint"):
          checkpoints.save_latest(ckpt_root, policy.save, dict(step=step, sampler=sampler.state()))
      times["time/step"] = time.perf_counter() - t_step
      metrics.update(times)
      writer.write(step, metrics)
      bar.update(step, metrics)
    bar.close()
  finally:
    writer.close()
    try:
      loop.run_until_complete(env.close())
    finally:
      loop.close()
  return finish_run(config, workdir, start, metrics, validator, resumed=state is not None)
