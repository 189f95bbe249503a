"""The end-of-run summary: start vs end validation metric, steps, time per phase, and the PNG curve."""
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
  table.add_row("GRPO steps", str(s["steps"]))
  table.add_row("SFT warm-start steps", str(s["sft_steps"]))
  table.add_row("set-up (Ray, model, fleets)", f"{setup_s:.0f} s")
  if s["sft_s"]:
    table.add_row("time: SFT warm start", f"{s['sft_s']:.0f} s")
  for p, secs in s["phases"].items():
    if secs:
      table.add_row(f"time: {p}", f"{secs:.0f} s")
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
