"""What surrounds the GRPO steps in `loop.grpo_train`, whichever trajectory source feeds them.

  RunSettings        what the run derives from the config once: losses, KL / IS settings,
                     padding, sampling (training and validation), scoring concurrency
  Validator          validation every `grpo.val_period` steps and at the last (val/* metrics, val_samples.jsonl)
                     and the best-k checkpoints it feeds
  start_run          resume from checkpoints/latest, or SFT warm start; refit when either moved
                     the weights
  resolve_reference  the KL penalty's reference policy (the policy after the warm start)
  save_latest        checkpoints/latest with the step and the source's state
  Progress           the tqdm bar (or log lines) with the live step summary
  finish_run         the curves PNG (`curve_panels`) and the `TrainResult` the runner reports
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import socket
import stat
import struct
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from dockyard import console, estimators
from dockyard import workdir as workdir_lib
from dockyard.grpo import checkpoints
from dockyard.grpo.sft import pack_episodes, sft_warmup
from dockyard.grpo.step import PAD_MULTIPLE, collect_groups, refit, score_groups
from dockyard.policy import LossFn, Policy
from dockyard.rollout.base import Generator, SamplingParams

log = logging.getLogger(__name__)
VAL_SAMPLES = "val_samples.jsonl"   # in the workdir: each validation's completions, one JSON per task
REFERENCE_DIR = "reference"   # under checkpoints/: the KL reference's weights (the policy after the warm start)


@contextlib.contextmanager
def timed(times: dict, key: str):
  """Adds the block's wall time to `times["time/<key>"]`."""
  t0 = time.perf_counter()
  try:
    yield
  finally:
    times[f"time/{key}"] = times.get(f"time/{key}", 0.0) + time.perf_counter() - t0


def driver_io_bytes() -> float:
  """Bytes sent plus received so far on this process's open TCP sockets (the kernel's per-socket
  tcp_info counters: bytes acked + bytes received): engine replies and Ray's control messages
  (gRPC), HTTP to the sandbox. Memory mapped from Ray's shared-memory object store is not in it,
  nor a socket closed since (the sandbox client and Ray keep theirs open). NaN where the kernel
  does not say (not Linux). The step metric `perf/driver_io_bytes` is its change over the step's
  take + update + refit: what the experience data plane (`rollout.data_plane`) takes off the
  driver."""
  if not hasattr(socket, "TCP_INFO") or not os.path.isdir("/proc/self/fd"):
    return float("nan")
  total = 0
  for name in os.listdir("/proc/self/fd"):
    try:
      if not stat.S_ISSOCK(os.fstat(int(name)).st_mode):
        continue
      sock = socket.socket(fileno=os.dup(int(name)))
    except OSError:   # closed meanwhile
      continue
    try:
      if sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET, socket.AF_INET6):
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
        if len(info) >= _TCP_INFO_LEN:
          total += sum(struct.unpack_from("QQ", info, _TCP_BYTES_ACKED))
    except OSError:
      pass
    finally:
      sock.close()
  return float(total)


# struct tcp_info (linux/tcp.h): tcpi_bytes_acked and tcpi_bytes_received, u64 each, from offset 120
_TCP_BYTES_ACKED, _TCP_INFO_LEN = 120, 136


@dataclasses.dataclass
class TrainResult:
  steps: int                        # GRPO steps done (including resumed ones)
  last_metrics: dict[str, float]
  val_history: list[dict[str, float]]
  best: dict | None                 # best-k entry {step, value, path} or None
  resumed_from: int | None          # the step resumed from, None on a fresh start


def sampling_params(config) -> SamplingParams:
  """How training groups are sampled (`rollout.*`); every source starts from these."""
  rollout = config.rollout
  return SamplingParams(temperature=rollout.temperature, top_p=rollout.top_p,
                        max_tokens=rollout.max_new_tokens)


def max_in_flight(config) -> int:
  """How many scorings may await at once (`env.code.max_in_flight`; 64 for envs without one)."""
  return int(config.env.code.max_in_flight) if "code" in config.env else 64


@dataclasses.dataclass
class RunSettings:
  """What the run derives from the config before the first step."""
  update_loss: LossFn   # the update's loss: clipped PG, or the preference loss (grpo.objective='dpo')
  nll: LossFn
  kl_coef: float
  pad_id: int
  max_in_flight: int
  sampling: SamplingParams
  val_sampling: SamplingParams
  num_minibatches: int = 1

  @classmethod
  def build(cls, config, tokenizer, losses: tuple[LossFn, LossFn],
            reference: Policy | Callable[[], Policy] | None = None) -> "RunSettings":
    """`losses`: (the update's loss, SFT NLL) in the policy's array type, from
    `policy_factory.make_losses(config)`: the loop never picks a backend."""
    update_loss, nll = losses
    kl_coef = float(config.loss_fn.reference_policy_kl_penalty)
    if kl_coef != 0 and reference is None:
      raise ValueError("loss_fn.reference_policy_kl_penalty != 0 needs a reference policy "
                       "(reference=a Policy, or a callable that builds one from the initial checkpoint)")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rollout = config.rollout
    return cls(update_loss=update_loss, nll=nll, kl_coef=kl_coef, pad_id=pad_id,
               max_in_flight=max_in_flight(config), sampling=sampling_params(config),
               val_sampling=SamplingParams(temperature=rollout.val_temperature, top_p=1.0,
                                           max_tokens=rollout.max_new_tokens, seed=config.run.seed),
               num_minibatches=int(config.grpo.num_minibatches))


def success_of(env) -> Callable[[Any], bool]:
  """The env's "this completion solves the task" test (`Environment.is_success`)."""
  return env.is_success


def pass_at_1_metrics(env, rewards: Sequence[Any]) -> dict[str, float]:
  """val/pass@1 of one sample per task (greedy at val_temperature 0) and its 95% Wilson interval."""
  ok = success_of(env)
  wins = sum(bool(ok(r)) for r in rewards)
  lo, hi = estimators.wilson_interval(wins, len(rewards))
  return {"val/pass@1": wins / max(len(rewards), 1), "val/pass@1_ci95_lo": lo, "val/pass@1_ci95_hi": hi}


def run_validation(generator: Generator, env, tokenizer, tasks: Sequence[Mapping[str, Any]],
                   sampling: SamplingParams, loop: asyncio.AbstractEventLoop | Callable,
                   max_in_flight: int = 64, samples: list | None = None,
                   episodes=None) -> dict[str, float]:
  """One completion per held-out task at the validation temperature; `val/*` metrics.

  `loop` runs the scoring coroutine: an event loop, or a callable taking the coroutine (a
  trajectory source's `run`: the env's clients live on its event loop). `episodes` (an agent
  config's `grpo.episodes.EpisodeGroups`): each task is one episode played in a session, as
  training plays them (the completion is its turns and tool results), instead of one completion
  scored by `env.score`. `samples`, when given, receives one record per task: instance id,
  completion text and its token count, reward, malformed, reason (and an episode's ending).
  """
  run = loop if callable(loop) else loop.run_until_complete
  if episodes is not None:
    groups = run(episodes.groups(tasks, sampling, n=1))
  else:
    groups = collect_groups(generator, env, tokenizer, tasks, 1, sampling)
    run(score_groups(env, groups, max_in_flight))
  rewards = [g.rewards[0] for g in groups]
  if samples is not None:
    for g, r in zip(groups, rewards):
      samples.append(dict(instance_id=str(g.task.get("instance_id", "")), completion=g.texts[0],
                          tokens=len(g.completions[0].token_ids),
                          reward=float(r.value), success=bool(success_of(env)(r)), malformed=bool(r.malformed),
                          reason=str(r.info.get("reason", "")),
                          **({"ending": str(r.info["ending"])} if "ending" in r.info else {})))
  out = {"val/reward_mean": float(np.mean([r.value for r in rewards])),
         "val/malformed_fraction": float(np.mean([r.malformed for r in rewards])),
         "val/completion_len_mean": float(np.mean([len(g.completions[0].token_ids) for g in groups]))}
  out.update(pass_at_1_metrics(env, rewards))
  out.update({f"val/{k}": float(v) for k, v in env.validation_metrics(rewards).items()})
  return out


class Validator:
  """Validation every `val_period` steps and at the last, and the best-k checkpoints it feeds."""

  def __init__(self, config, policy: Policy, generator: Generator, env, tokenizer,
               val_tasks: Sequence[Mapping[str, Any]], settings: RunSettings, ckpt_root: str, run_coro,
               samples_path: str | None = None, episodes=None):
    """`episodes`: an agent config's episode player (validation plays episodes: `run_validation`)."""
    self.samples_path = samples_path   # val_samples.jsonl: every validation's completions, by step
    self.episodes = episodes
    self.config, self.policy, self.generator, self.env, self.tokenizer = config, policy, generator, env, tokenizer
    self.tasks = list(val_tasks)[:config.grpo.max_val_samples]
    self.settings, self.run_coro = settings, run_coro
    ckpt = config.checkpoint
    self.best = checkpoints.BestK(ckpt_root, ckpt.keep_top_k, ckpt.metric_mode)
    self.history: list[dict] = []

  def due(self, step: int) -> bool:
    """Every `val_period` steps and at the last step (so a run always ends on a validation of
    its final weights); never when `val_period` is 0."""
    grpo = self.config.grpo
    return (bool(self.tasks) and grpo.val_period > 0
            and (step % grpo.val_period == 0 or step == grpo.max_num_steps))

  def __call__(self, step: int) -> dict:
    ckpt, times = self.config.checkpoint, {}
    samples: list[dict] = []
    with timed(times, "validate"):
      val = run_validation(self.generator, self.env, self.tokenizer, self.tasks, self.settings.val_sampling,
                           self.run_coro, self.settings.max_in_flight, samples=samples,
                           episodes=self.episodes)
    if self.samples_path:
      workdir_lib.append_jsonl(self.samples_path, ({"step": step, **rec} for rec in samples))
    val.update(times)
    self.history.append({"step": step, **val})
    if ckpt.enabled:
      if ckpt.metric not in val:
        raise ValueError(f"config.checkpoint.metric {ckpt.metric!r} is not a validation metric of "
                         f"env {self.config.env.name!r}; it reports {sorted(val)}")
      val["checkpoint/saved_best"] = float(self.best.offer(step, val[ckpt.metric], self.policy.save))
    return val


def resolve_reference(config, policy: Policy, reference: Policy | Callable[[], Policy] | None,
                      ckpt_root: str, warm_started: bool, needed: bool) -> Policy | None:
  """The reference policy (of the KL penalty, or of an update that reads one), or None when not
  `needed`.

  `reference` is a Policy (used as is) or a callable building one from the initial checkpoint.
  The reference is the policy GRPO starts from: after an SFT warm start, its weights are saved to
  checkpoints/reference/ (through `Policy.save`) and loaded into the built one, also on resume.
  """
  if not needed or reference is None:
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
              ckpt_root: str, progress: bool = True, episodes=None,
              run_coro: Callable | None = None) -> tuple[int, dict | None]:
  """Resumes from ckpt_root/latest or warm-starts with SFT (with a bar when `progress`), then
  refits the engine if the policy changed; returns (start step, the resumed loop_state or None).
  `episodes` (an agent config's `grpo.episodes.EpisodeGroups`, with `run_coro` to run its
  coroutines): the warm start trains on the train tasks' oracle episodes, token for token as
  episodes train (`dockyard.agent.oracle`), instead of their gold chats."""
  grpo = config.grpo
  latest = checkpoints.load_latest(ckpt_root) if config.checkpoint.enabled else None
  if latest is not None:
    path, state = latest
    policy.restore(path)
    log.info("resumed from %s at step %d", path, int(state["step"]))
  elif grpo.sft_warmup.steps > 0:
    sw = grpo.sft_warmup
    bar = console.bar(sw.steps, "sft warm start", enabled=progress)

    def on_step(i, m):
      writer.write(i, {f"sft/{k}": v for k, v in m.items()})
      if bar is not None:
        bar.set_postfix_str(f"loss {m.get('loss', float('nan')):.3f}", refresh=False)
        bar.update(1)
    items, make_batch = train_tasks, None
    if episodes is not None:
      played, failed = run_coro(episodes.play_oracle(train_tasks))
      writer.write(0, {"sft/oracle_episodes": float(len(played)), "sft/oracle_failed": float(len(failed))})
      if failed:
        log.warning("SFT warm start: %d oracle episodes did not pass their checker and are left out: %s",
                    len(failed), failed[:10])
      if not played:
        raise ValueError("SFT warm start: no oracle episode passed its checker")
      pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
      items, make_batch = played, (lambda eps: pack_episodes(eps, pad_id, PAD_MULTIPLE))
    try:
      sft_warmup(policy, env, tokenizer, items, steps=sw.steps, batch_size=sw.batch_size, lr=sw.lr,
                 loss_fn=nll, seed=config.run.seed, pad_multiple=PAD_MULTIPLE, on_step=on_step,
                 make_batch=make_batch)
    finally:
      if bar is not None:
        bar.close()
  if latest is not None or grpo.sft_warmup.steps > 0:
    refit(synchronizer)   # the engine still holds the initial weights
  return (int(latest[1]["step"]), latest[1]) if latest is not None else (0, None)


def save_due(config, step: int) -> bool:
  ckpt = config.checkpoint
  return bool(ckpt.enabled) and (step % ckpt.save_period == 0 or step == config.grpo.max_num_steps)


def save_latest(ckpt_root: str, policy: Policy, step: int, source_state: Mapping[str, Any],
                row: Mapping[str, float] | None = None) -> None:
  """checkpoints/latest: the policy and loop_state.json = {step, **the source's state, row: the
  step's metrics so far}. The loop writes the step's metrics row after the checkpoint (the row
  holds its time); a run killed between the two gets the row back on resume
  (`restore_last_row`)."""
  state = dict(step=step, **source_state)
  if row is not None:
    state["row"] = {k: float(v) for k, v in row.items()}
  checkpoints.save_latest(ckpt_root, policy.save, state)


def restore_last_row(workdir: str, state: Mapping[str, Any] | None, writer) -> None:
  """On resume: writes the checkpointed step's metrics row from loop_state.json when
  metrics.jsonl lacks it (the run was killed after the checkpoint, before the row). A row counts
  as written when some row of that step holds every key of the checkpointed one: other rows share
  step numbers (the SFT warm start's `sft/*` rows count their own steps from 1)."""
  if state is None or "row" not in state:
    return
  step, keys = int(state["step"]), set(state["row"])
  path = os.path.join(workdir, "metrics.jsonl")
  rows = workdir_lib.read_metrics(path) if os.path.exists(path) else []
  if not any(r.get("step") == step and keys <= set(r) for r in rows):
    writer.write(step, state["row"])


def _live_line(step: int, m: Mapping[str, float], kl: bool = False) -> str:
  def f(key, fmt="{:.3f}"):
    v = m.get(key)
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)
  return (f"step {step} reward {f('reward/raw_mean')} zero-var {f('groups/zero_variance_fraction', '{:.2f}')} "
          + (f"kl {f('train/kl', '{:.4f}')} " if kl else "")
          + f"len {f('rollout/completion_len_mean', '{:.1f}')} "
          f"gen {f('time/generate', '{:.1f}')}s train {f('time/train', '{:.1f}')}s "
          f"refit {f('time/refit', '{:.1f}')}s")


class Progress:
  """A tqdm bar (`console.bar`) with the live step summary, or log lines when not `enabled`;
  `kl`: the summary shows the KL to the reference (only a KL penalty makes it non-zero)."""

  def __init__(self, enabled: bool, total: int, initial: int, desc: str, kl: bool = False):
    self.bar = console.bar(total, desc, initial=initial, enabled=enabled)
    self.kl = kl

  def update(self, step: int, metrics: Mapping[str, float]) -> None:
    line = _live_line(step, metrics, self.kl)
    if self.bar is None:
      log.info(line)
    else:
      self.bar.set_postfix_str(line.split(" ", 2)[2], refresh=False)
      self.bar.update(1)

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()


def finish_run(config, workdir: str, start: int, metrics: dict, validator, *, resumed: bool) -> TrainResult:
  """The end of a run: the curves PNG and the result the runner reports."""
  plot_run(config, workdir)
  return TrainResult(steps=max(start, int(config.grpo.max_num_steps)), last_metrics=metrics,
                     val_history=validator.history, best=validator.best.best,
                     resumed_from=start if resumed else None)


def curve_panels(config) -> list[workdir_lib.Panel]:
  """What curves.png shows: the panels that can carry information under this config.

  Validation: `val/pass@1` (every env has it) with its 95% Wilson interval, and the checkpoint
  metric beside it when that is another (`val/resolve_rate`, `val/accuracy`). The KL panel only
  with a KL penalty (without one no reference is kept and the KL is 0), the clip fraction only
  with several minibatches a step (with one, the update's ratio is 1 and nothing is clipped), the
  preference loss and margin only under online DPO (grpo.objective='dpo').
  """
  metric = config.checkpoint.metric
  panels = [workdir_lib.Panel("reward/raw_mean", smooth=10),
            workdir_lib.Panel("val/pass@1", band=True, also=(metric,) if metric != "val/pass@1" else ()),
            workdir_lib.Panel("groups/zero_variance_fraction")]
  if float(config.loss_fn.reference_policy_kl_penalty) != 0:
    panels.append(workdir_lib.Panel("train/kl"))
  panels += [workdir_lib.Panel("rollout/entropy_approx"),
             workdir_lib.Panel("rollout/completion_len_mean", also=("val/completion_len_mean",))]
  if int(config.grpo.num_minibatches) > 1:
    panels.append(workdir_lib.Panel("train/clip_fraction"))
  if config.grpo.objective == "dpo":   # online DPO's step: its loss and implicit-reward margin
    panels += [workdir_lib.Panel("train/preference_loss", smooth=10),
               workdir_lib.Panel("train/reward_margin", smooth=10)]
  return panels


def plot_run(config, workdir: str) -> None:
  if config.logging.png_curve and os.path.exists(os.path.join(workdir, "metrics.jsonl")):
    workdir_lib.plot_curves(os.path.join(workdir, "metrics.jsonl"), os.path.join(workdir, "curves.png"),
                            curve_panels(config), title=config.run.name)
