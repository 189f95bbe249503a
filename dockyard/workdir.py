"""The run's workdir: `config.json`, `metrics.jsonl`, `tensorboard/`, `checkpoints/`.

`MetricWriter` writes every step's scalars to JSONL and TensorBoard; `plot_curves` turns
`metrics.jsonl` into a PNG. Re-running into the same workdir resumes from `checkpoints/`.
"""
from __future__ import annotations

import json
import math
import os
from typing import Mapping

import ml_collections


def prepare(workdir: str, config: ml_collections.ConfigDict) -> dict[str, str]:
  paths = {
      "workdir": workdir,
      "config": os.path.join(workdir, "config.json"),
      "metrics": os.path.join(workdir, "metrics.jsonl"),
      "tensorboard": os.path.join(workdir, "tensorboard"),
      "checkpoints": os.path.join(workdir, "checkpoints"),
  }
  os.makedirs(paths["tensorboard"], exist_ok=True)
  os.makedirs(paths["checkpoints"], exist_ok=True)
  with open(paths["config"], "w") as f:
    f.write(config.to_json_best_effort(indent=2, sort_keys=True))
  return paths


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


def plot_curves(metrics_path: str, png_path: str, keys: tuple[str, ...], title: str = "") -> str:
  """Plots each key of metrics.jsonl against step into one PNG (one panel per key)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  rows = read_metrics(metrics_path)
  present = [k for k in keys if any(r.get(k) is not None for r in rows)]
  fig, axes = plt.subplots(len(present) or 1, 1, figsize=(7, 2.6 * max(len(present), 1)), squeeze=False)
  for ax, key in zip(axes[:, 0], present):
    pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3)
    ax.set_ylabel(key)
    ax.grid(alpha=0.3)
  axes[-1, 0].set_xlabel("step")
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(png_path, dpi=110)
  plt.close(fig)
  return png_path
