"""The run's workdir: `config.json`, `metrics.jsonl`, `run.log`, `tensorboard/`, `checkpoints/`.

`prepare` writes config.json and `read_config` reads it back (`dockyard.export` does).
`MetricWriter` writes every step's scalars to JSONL and TensorBoard; `plot_curves` turns
`metrics.jsonl` into a PNG of `Panel`s. Re-running into the same workdir resumes from `checkpoints/`.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Mapping, Sequence

import ml_collections


def prepare(workdir: str, config: ml_collections.ConfigDict) -> dict[str, str]:
  paths = {
      "workdir": workdir,
      "config": os.path.join(workdir, "config.json"),
      "metrics": os.path.join(workdir, "metrics.jsonl"),
      "log": os.path.join(workdir, "run.log"),   # all the run's output (`console.capture`)
      "tensorboard": os.path.join(workdir, "tensorboard"),
      "checkpoints": os.path.join(workdir, "checkpoints"),
  }
  os.makedirs(paths["tensorboard"], exist_ok=True)
  os.makedirs(paths["checkpoints"], exist_ok=True)
  with open(paths["config"], "w") as f:
    f.write(config.to_json_best_effort(indent=2, sort_keys=True))
  return paths


def read_config(workdir: str) -> ml_collections.ConfigDict:
  """The run's config as `prepare` wrote it to `<workdir>/config.json`. JSON has no tuples: its
  lists come back as the tuples the configs write (configs/ has no list values)."""
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{workdir}: no config.json (is it a run's workdir?)")
  with open(path) as f:
    return ml_collections.ConfigDict(_tuples(json.load(f)))


def _tuples(x):
  if isinstance(x, dict):
    return {k: _tuples(v) for k, v in x.items()}
  if isinstance(x, list):
    return tuple(_tuples(v) for v in x)
  return x


class MetricWriter:
  """Appends {'step': s, **scalars} to metrics.jsonl and writes the same scalars to TensorBoard."""

  def __init__(self, workdir: str, tensorboard: bool = True):
    os.makedirs(workdir, exist_ok=True)
    self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a", buffering=1)
    self._tb = None
    if tensorboard:
      from tensorboardX import SummaryWriter
      self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    clean = {}
    for k, v in scalars.items():
      v = float(v)
      clean[k] = v if math.isfinite(v) else None
      if self._tb is not None and math.isfinite(v):
        self._tb.add_scalar(k, v, step)
    self._jsonl.write(json.dumps({"step": int(step), **clean}) + "\n")

  def close(self) -> None:
    self._jsonl.close()
    if self._tb is not None:
      self._tb.close()


def append_jsonl(path: str, rows) -> None:
  """Appends each row (a JSON-serializable dict) as one line of `path`."""
  with open(path, "a") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")


def read_metrics(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def by_step(rows: Sequence[dict]) -> dict[int, dict]:
  """One row per step, in step order. A resumed run appends the steps after its checkpoint again:
  per step, the last value of each key counts."""
  out: dict[int, dict] = {}
  for r in rows:
    out[int(r["step"])] = {**out.get(int(r["step"]), {}), **r}
  return dict(sorted(out.items()))


def trailing_mean(ys: Sequence[float], k: int) -> list[float]:
  """Each value's mean with the up to `k - 1` values before it (one per value: the first windows
  are shorter)."""
  if k < 1:
    raise ValueError(f"trailing_mean: window k must be >= 1, got {k}")
  c = [0.0]
  for y in ys:
    c.append(c[-1] + float(y))
  return [(c[i + 1] - c[max(0, i + 1 - k)]) / min(k, i + 1) for i in range(len(ys))]


@dataclasses.dataclass(frozen=True)
class Panel:
  """One panel of `plot_curves`: a metric against step."""
  key: str
  smooth: int = 0                # > 1: the values faint, their trailing mean over `smooth` steps on top
  band: bool = False             # shade `<key>_ci95_lo`..`<key>_ci95_hi` where every point carries them
  also: tuple[str, ...] = ()     # further metrics on the same axes (e.g. the validation lengths)


def plot_curves(metrics_path: str, png_path: str, panels: Sequence[Panel], title: str = "") -> list[Panel]:
  """Plots each panel whose metric metrics.jsonl has into one PNG; returns the panels drawn."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  rows = list(by_step(read_metrics(metrics_path)).values())
  points = lambda key: [(r["step"], r) for r in rows if r.get(key) is not None]
  drawn = [p for p in panels if points(p.key)]
  fig, axes = plt.subplots(len(drawn) or 1, 1, figsize=(7, 2.4 * max(len(drawn), 1)), sharex=True, squeeze=False)
  for ax, p in zip(axes[:, 0], drawn):
    pts = points(p.key)
    x, y = [s for s, _ in pts], [r[p.key] for _, r in pts]
    if p.smooth > 1 and len(y) > 1:
      ax.plot(x, y, color="C0", alpha=0.3, lw=1, label=p.key)
      ax.plot(x, trailing_mean(y, p.smooth), color="C0", lw=2, label=f"mean of the last {p.smooth} steps")
    else:
      ax.plot(x, y, color="C0", marker="o", ms=3, label=p.key)
    lo, hi = f"{p.key}_ci95_lo", f"{p.key}_ci95_hi"
    if p.band and all(r.get(lo) is not None and r.get(hi) is not None for _, r in pts):
      ax.fill_between(x, [r[lo] for _, r in pts], [r[hi] for _, r in pts], color="C0", alpha=0.15,
                      label="95% interval")
    for i, key in enumerate(p.also, start=1):
      more = points(key)
      if more:
        ax.plot([s for s, _ in more], [r[key] for _, r in more], color=f"C{i}", marker="o", ms=3, label=key)
    ax.set_title(p.key, fontsize=9, loc="left")
    if p.smooth > 1 or p.band or p.also:
      ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
  axes[-1, 0].set_xlabel("step")
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(png_path, dpi=110)
  plt.close(fig)
  return drawn
