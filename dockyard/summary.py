"""The end-of-run summary: start vs end validation metric, steps, time per phase, and the PNG curve
(`render` for GRPO, `render_preference` for the DPO family, `render_sft` for SFT, `render_reward_model` for a reward model)."""
from __future__ import annotations

import os

from rich.console import Console
from rich.table import Table

from dockyard import workdir as workdir_lib

PHASES = ("generate", "score", "train", "refit", "validate", "checkpoint")


def collect(metrics_path: str, metric: str) -> dict:
  rows = workdir_lib.read_metrics(metrics_path) if os.path.exists(metrics_path) else []
  vals = [(r["step"], r[metric]) for r in rows if r.get(metric) is not None]
  rewards = [r["reward/raw_mean"] for r in rows if r.get("reward/raw_mean") is not None]
  phases = {p: sum(r.get(f"time/{p}") or 0.0 for r in rows) for p in PHASES}
  sft = [r for r in rows if any(k.startswith("sft/") for k in r)]
  return dict(
      val_start=vals[0] if vals else None, val_end=vals[-1] if vals else None,
      val_best=max(vals, key=lambda v: v[1]) if vals else None,
      reward_first=sum(rewards[:3]) / len(rewards[:3]) if rewards else None,
      reward_last=sum(rewards[-3:]) / len(rewards[-3:]) if rewards else None,
      steps=max((r["step"] for r in rows if "time/step" in r), default=0),
      sft_steps=len(sft), sft_s=sum(r.get("sft/time_s") or 0.0 for r in sft), phases=phases)


def render(config, workdir: str, result=None, setup_s: float = 0.0, total_s: float = 0.0) -> str:
  metric = config.checkpoint.metric
  s = collect(os.path.join(workdir, "metrics.jsonl"), metric)
  table = Table(title=f"{config.run.name}: summary")
  table.add_column("what")
  table.add_column("value", justify="right")
  fmt = lambda v: "n/a" if v is None else f"{v[1]:.3f} (step {v[0]})"
  table.add_row(f"{metric} at start", fmt(s["val_start"]))
  table.add_row(f"{metric} at end", fmt(s["val_end"]))
  table.add_row(f"{metric} best", fmt(s["val_best"]))
  if s["reward_first"] is not None:
    table.add_row("train reward, first 3 steps -> last 3", f"{s['reward_first']:.3f} -> {s['reward_last']:.3f}")
  objective = config.grpo.objective
  table.add_row({"policy_gradient": "GRPO steps", "dpo": "online DPO steps", "distill": "distillation steps"}
                .get(objective, "steps"), str(s["steps"]))
  table.add_row("SFT warm-start steps", str(s["sft_steps"]))
  table.add_row("set-up (Ray, model, fleets)", f"{setup_s:.0f} s")
  if s["sft_s"]:
    table.add_row("time: SFT warm start", f"{s['sft_s']:.0f} s")
  for p, secs in s["phases"].items():
    if secs:
      table.add_row(f"time: {p}", f"{secs:.0f} s")
  return _finish(table, workdir, total_s)


def _finish(table: Table, workdir: str, total_s: float) -> str:
  """The rows every summary ends with (total time, the curves PNG), rendered and written to
  <workdir>/summary.txt."""
  table.add_row("total", f"{total_s:.0f} s")
  png = os.path.join(workdir, "curves.png")
  if os.path.exists(png):
    table.add_row("curves", png)
  console = Console(record=True, width=100)
  with console.capture() as cap:
    console.print(table)
  text = cap.get()
  with open(os.path.join(workdir, "summary.txt"), "w") as f:
    f.write(text)
  return text


def _first_last_table(config, workdir: str, kind: str, val_keys) -> tuple[Table, list[dict]]:
  """The opening of a non-GRPO run's summary (DPO family, reward model, SFT): its metrics rows (one
  per step), and a table titled with `kind` and the backend holding each of `val_keys` first ->
  last and the mean train loss of the first 5 steps -> the last 5."""
  path = os.path.join(workdir, "metrics.jsonl")
  rows = list(workdir_lib.by_step(workdir_lib.read_metrics(path)).values()) if os.path.exists(path) else []
  table = Table(title=f"{config.run.name}: summary ({kind}, {config.policy.backend})")
  table.add_column("what")
  table.add_column("value", justify="right")
  for key in val_keys:
    vals = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    if vals:
      table.add_row(f"{key}, first -> last",
                    f"{vals[0][1]:.3f} (step {vals[0][0]}) -> {vals[-1][1]:.3f} (step {vals[-1][0]})")
  losses = [r["train/loss"] for r in rows if r.get("train/loss") is not None]
  if losses:
    k = min(5, len(losses))
    table.add_row(f"train/loss, first {k} steps -> last {k}",
                  f"{sum(losses[:k]) / k:.3f} -> {sum(losses[-k:]) / k:.3f}")
  return table, rows


def _phase_rows(table: Table, rows: list[dict], phases) -> None:
  """A "time: <phase>" row per phase that took any time, summed over the steps."""
  for p in phases:
    secs = sum(r.get(f"time/{p}") or 0.0 for r in rows)
    if secs:
      table.add_row(f"time: {p}", f"{secs:.0f} s")


PREFERENCE_PHASES = ("reference", "train", "validate", "generate", "checkpoint")


def render_preference(config, workdir: str, result=None, setup_s: float = 0.0, total_s: float = 0.0) -> str:
  """A DPO-family run (`dpo.loop.dpo_train`): held-out metrics first -> last, train loss, times."""
  table, rows = _first_last_table(config, workdir, config.dpo.mode, (
      "val/preference_loss", "val/reward_accuracy", "val/chosen_preferred", "val/reward_margin", "val/pass@1"))
  table.add_row("steps", str(max((r["step"] for r in rows if "time/step" in r), default=0)))
  table.add_row("set-up (model, trainer, reference; engine and pairs when made)", f"{setup_s:.0f} s")
  _phase_rows(table, rows, PREFERENCE_PHASES)
  return _finish(table, workdir, total_s)


def render_reward_model(config, workdir: str, result=None, setup_s: float = 0.0, total_s: float = 0.0) -> str:
  """A reward-model run (`rm.loop.rm_train`): held-out loss and accuracy first -> last, train loss,
  where the model was saved, times."""
  table, rows = _first_last_table(config, workdir, "reward model", ("val/loss", "val/accuracy", "val/reward_margin"))
  if result is not None:
    table.add_row("reward model saved to", result.model_dir)
  table.add_row("set-up (model, head)", f"{setup_s:.0f} s")
  _phase_rows(table, rows, ("train", "validate"))
  return _finish(table, workdir, total_s)


SFT_PHASES = ("train", "validate", "generate", "checkpoint")


def render_sft(config, workdir: str, result=None, setup_s: float = 0.0, total_s: float = 0.0) -> str:
  """An SFT run (`supervised.loop.sft_train`): held-out loss and pass@1 first -> last, train loss, times."""
  table, rows = _first_last_table(config, workdir, "sft", ("val/loss", "val/pass@1"))
  table.add_row("steps", str(max((r["step"] for r in rows if "train/loss" in r), default=0)))
  table.add_row("set-up (model, trainer, engine)", f"{setup_s:.0f} s")
  _phase_rows(table, rows, SFT_PHASES)
  return _finish(table, workdir, total_s)
