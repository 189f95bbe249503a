r"""Several runs of one recipe (seeds): the validation metric at start, end and best as mean ± sd,
per-run rows, and one PNG with every run's validation curve (with its 95% interval when the metric
has one, e.g. `val/pass@1`) and its smoothed training reward (the train loss for runs without one:
SFT, DPO).

  python -m dockyard.seeds --metric=val/pass@1 --png=docs/img/smollm_seeds.png \
      workdirs/smollm_s0 workdirs/smollm_s1 workdirs/smollm_s2

Reads each workdir's metrics.jsonl (the loop's own log); writes nothing else. sd is the sample
standard deviation (n - 1); with one run it is reported as nan, never 0.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Sequence

import numpy as np
from absl import app, flags

from dockyard import workdir as workdir_lib

_METRIC = flags.DEFINE_string("metric", "val/pass@1", "The validation metric to report.")
_PNG = flags.DEFINE_string("png", "", "Where to write the curves (empty: no PNG).")
_JSON = flags.DEFINE_string("json", "", "Where to write the numbers as JSON (empty: stdout only).")


def run_summary(workdir: str, metric: str) -> dict:
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{workdir}: no metrics.jsonl (is it a run's workdir?)")
  rows = workdir_lib.read_metrics(path)
  by_step = workdir_lib.by_step(rows)
  vals = sorted((s, float(r[metric])) for s, r in by_step.items() if r.get(metric) is not None)
  if not vals:
    raise ValueError(f"{workdir}: metrics.jsonl has no {metric!r}")
  timed_rows = [r for r in rows if r.get("time/step") is not None]
  redone = len(timed_rows) - len({int(r["step"]) for r in timed_rows})
  return dict(workdir=workdir, start=vals[0], end=vals[-1], best=max(vals, key=lambda v: v[1]),
              gain=vals[-1][1] - vals[0][1], steps=max((int(r["step"]) for r in timed_rows), default=0),
              wall_s=float(sum(r["time/step"] for r in timed_rows)), redone_steps=redone)


def mean_sd(xs: Sequence[float]) -> tuple[float, float]:
  xs = np.asarray(xs, np.float64)
  return float(xs.mean()), float(xs.std(ddof=1)) if xs.size > 1 else float("nan")


def summarize(workdirs: Sequence[str], metric: str) -> dict:
  runs = [run_summary(w, metric) for w in workdirs]
  out = {"metric": metric, "runs": runs, "n": len(runs)}
  for key in ("start", "end", "best"):
    out[key] = mean_sd([r[key][1] for r in runs])
  out["gain"] = mean_sd([r["gain"] for r in runs])
  return out


def render(s: dict) -> str:
  f = lambda ms: f"{ms[0]:.3f} ± {ms[1]:.3f}"
  lines = [f"{s['metric']} over {s['n']} run(s): start {f(s['start'])}, end {f(s['end'])}, "
           f"best {f(s['best'])}, gain (end - start) {f(s['gain'])}"]
  for r in s["runs"]:
    lines.append(f"  {r['workdir']}: {r['start'][1]:.3f} (step {r['start'][0]}) -> {r['end'][1]:.3f} "
                 f"(step {r['end'][0]}), best {r['best'][1]:.3f} (step {r['best'][0]}), "
                 f"{r['steps']} steps ({r['redone_steps']} redone after a resume) in {r['wall_s'] / 60:.1f} min of steps")
  return "\n".join(lines)


def plot(workdirs: Sequence[str], metric: str, png: str, smooth: int = 10) -> str:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
  runs = {w: list(workdir_lib.by_step(workdir_lib.read_metrics(os.path.join(w, "metrics.jsonl"))).values())
          for w in workdirs}
  # The bottom panel: the training reward (GRPO and its objectives), else the train loss (SFT, DPO).
  train_key, train_name = "reward/raw_mean", "train reward"
  if not any(r.get(train_key) is not None for rows in runs.values() for r in rows):
    train_key, train_name = "train/loss", "train loss"
  for w, rows in runs.items():
    label = os.path.basename(os.path.normpath(w))
    v = [r for r in rows if r.get(metric) is not None]
    line, = top.plot([r["step"] for r in v], [r[metric] for r in v], marker="o", ms=3, label=label)
    lo, hi = f"{metric}_ci95_lo", f"{metric}_ci95_hi"
    if all(r.get(lo) is not None and r.get(hi) is not None for r in v):
      top.fill_between([r["step"] for r in v], [r[lo] for r in v], [r[hi] for r in v],
                       color=line.get_color(), alpha=0.12)
    t = [r for r in rows if r.get(train_key) is not None]
    if t:
      bottom.plot([r["step"] for r in t], workdir_lib.trailing_mean([r[train_key] for r in t], smooth),
                  color=line.get_color(), label=label)
  top.set_ylabel(f"{metric} (held out)")
  bottom.set_ylabel(f"{train_name} (mean of the last {smooth} steps)")
  bottom.set_xlabel("step")
  for ax in (top, bottom):
    ax.grid(alpha=0.3)
  top.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(png, dpi=110)
  plt.close(fig)
  return png


def main(argv: Sequence[str]) -> None:
  workdirs = list(argv[1:])
  if not workdirs:
    raise app.UsageError("name one or more run workdirs")
  s = summarize(workdirs, _METRIC.value)
  print(render(s))
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump(s, f, indent=1)
  if _PNG.value:
    print(f"curves: {plot(workdirs, _METRIC.value, _PNG.value)}")
  sys.stdout.flush()


if __name__ == "__main__":
  app.run(main)
