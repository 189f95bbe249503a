"""`grpo_train`: the one GRPO loop, over whichever trajectory source the runner built.

Set-up (resume or SFT warm start, the KL reference, the source's start), then per step: the
source hands over scored groups -> advantages (dynamic sampling may drop flat groups) ->
one policy update (`update`: GRPO's policy-gradient step, online DPO's preference step on each
group's best-vs-worst pair (`dockyard.dpo.online`), or on-policy distillation's
(`dockyard.distill`)) -> the weights pushed to the engines (inside the source's `around_refit`)
-> validation and checkpoints when due -> one metrics row; then teardown. Synchronous or
asynchronous GRPO differ only in the source (`dockyard.grpo.source`); the step pieces are in
`step.py`, the settings / validator / checkpoints / progress around them in `harness.py`.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Mapping, Sequence

from dockyard import workdir as workdir_lib
from dockyard.grpo import harness
from dockyard.grpo.harness import RunSettings, TrainResult, Validator, timed
from dockyard.grpo.episodes import EpisodeGroups
from dockyard.grpo.source import TrajectorySource
from dockyard.grpo.step import POLICY_GRADIENT, Update, assign_advantages, refit
from dockyard.policy import LossFn, Policy
from dockyard.rollout.base import Generator


def grpo_train(config, *, source: TrajectorySource, policy: Policy, generator: Generator, synchronizer, env,
               tokenizer, train_tasks: Sequence[Mapping[str, Any]], val_tasks: Sequence[Mapping[str, Any]],
               workdir: str, losses: tuple[LossFn, LossFn],
               reference: Policy | Callable[[], Policy] | None = None, update: Update = POLICY_GRADIENT,
               progress: bool = True) -> TrainResult:
  """GRPO for `config.grpo.max_num_steps` steps on the groups `source` supplies; resumes from
  workdir/checkpoints (the source's state included).

  `generator` and `env` serve validation; `train_tasks` the SFT warm start; `losses` is
  (the update's loss, SFT NLL) for the policy's backend (`policy_factory.make_losses`); `update`
  the step taken on the kept groups (`policy_factory.make_update`: grpo.objective);
  `reference` (needed when the KL penalty is on or `update.reads_reference`): see
  `harness.resolve_reference`.
  """
  if update.reads_reference and reference is None:
    raise ValueError(f"the {update.name} update reads a reference policy: pass reference=a Policy, or "
                     "a callable that builds one from the initial checkpoint")
  grpo = config.grpo
  settings = RunSettings.build(config, tokenizer, losses, reference)
  ckpt_root = os.path.join(workdir, "checkpoints")
  os.makedirs(ckpt_root, exist_ok=True)
  writer = workdir_lib.MetricWriter(workdir, tensorboard=config.logging.tensorboard)
  # An agent config validates on episodes and warm-starts on oracle episodes (its own player, so
  # that the source's agent/* metrics count training episodes only).
  episodes = (EpisodeGroups(config, generator=generator, env=env, tokenizer=tokenizer)
              if "agent" in config else None)
  validator = Validator(config, policy, generator, env, tokenizer, val_tasks, settings, ckpt_root, source.run,
                        samples_path=os.path.join(workdir, harness.VAL_SAMPLES), episodes=episodes)
  metrics: dict[str, float] = {}
  try:
    start, state = harness.start_run(config, policy=policy, synchronizer=synchronizer, env=env,
                                     tokenizer=tokenizer, train_tasks=train_tasks, writer=writer,
                                     nll=settings.nll, ckpt_root=ckpt_root, progress=progress,
                                     episodes=episodes, run_coro=source.run)
    reference = harness.resolve_reference(config, policy, reference, ckpt_root,
                                          warm_started=grpo.sft_warmup.steps > 0,
                                          needed=settings.kl_coef != 0 or update.reads_reference)
    harness.restore_last_row(workdir, state, writer)
    source.start(workdir, start, state)
    if grpo.val_at_start and start == 0 and validator.tasks:
      writer.write(0, validator(0))

    bar = harness.Progress(progress, grpo.max_num_steps, start, source.name, kl=settings.kl_coef != 0)
    for step in range(start + 1, grpo.max_num_steps + 1):
      times: dict[str, float] = {}
      t_step, io_start = time.perf_counter(), harness.driver_io_bytes()
      groups, rollout = source.take(step)
      kept, metrics = assign_advantages(groups, config)
      metrics.update(rollout)
      if kept:
        with timed(times, "train"):
          metrics.update(update.fn(policy, kept, settings, reference))
        with timed(times, "refit"), source.around_refit(step):
          metrics.update(refit(synchronizer))
      else:   # every group was flat and dynamic sampling dropped them all: nothing to learn
        metrics["train/skipped"] = 1.0
      metrics["weight_version"] = float(synchronizer.version)
      metrics.update(source.after_step(step, trained=bool(kept)))
      metrics["perf/driver_io_bytes"] = harness.driver_io_bytes() - io_start
      if validator.due(step):
        metrics.update(validator(step))
      if harness.save_due(config, step):
        row = {**metrics, **times}
        with timed(times, "checkpoint"):
          harness.save_latest(ckpt_root, policy, step, source.state(), row=row)
      times["time/step"] = time.perf_counter() - t_step
      metrics.update(times)
      writer.write(step, metrics)
      bar.update(step, metrics)
    bar.close()
  finally:
    writer.close()
    source.close()
  return harness.finish_run(config, workdir, start, metrics, validator, resumed=state is not None)
