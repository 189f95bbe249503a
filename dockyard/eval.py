r"""Evaluation: generate once per task of the test split and report the resolve rate with a 95%
confidence interval, through the same code path as validation (`sync_loop.run_validation`).

  python -m dockyard.eval --config=configs/swe.py --workdir=workdirs/swe_eval \
      [--config.policy.model_name_or_path=/path/to/hf/checkpoint]

It is `dockyard.launch` with `run.mode=eval`: the same validation of the config and the same parts.
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import sys

from dockyard.rollout.base import SamplingParams


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
  """The Wilson score interval of a binomial proportion (well-behaved at 0, 1 and small n)."""
  if n == 0:
    return (0.0, 1.0)
  p = successes / n
  denom = 1 + z * z / n
  centre = (p + z * z / (2 * n)) / denom
  half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
  return (max(0.0, centre - half), min(1.0, centre + half))


def evaluate(config, *, generator, env, tokenizer, tasks, workdir: str) -> dict:
  from dockyard.grpo.sync_loop import run_validation
  if not tasks:
    raise ValueError("config.data.test: the test split has no tasks")
  r = config.rollout
  sampling = SamplingParams(temperature=r.val_temperature, top_p=1.0, max_tokens=r.max_new_tokens,
                            seed=config.run.seed)
  loop = asyncio.new_event_loop()
  try:
    max_in_flight = int(config.env.code.max_in_flight)
    metrics = run_validation(generator, env, tokenizer, tasks, sampling, loop, max_in_flight)
    loop.run_until_complete(env.close())
  finally:
    loop.close()
  key = "val/resolve_rate" if "val/resolve_rate" in metrics else config.checkpoint.metric
  n = len(tasks)
  successes = round(metrics[key] * n)
  lo, hi = wilson_interval(successes, n)
  report = {"n": n, "metric": key.split("/", 1)[1], "rate": metrics[key], "ci95": [lo, hi], **metrics}
  with open(os.path.join(workdir, "eval.json"), "w") as f:
    json.dump(report, f, indent=2)
  print(f"eval: {report['metric']} = {metrics[key]:.3f} ({successes}/{n}), 95% CI [{lo:.3f}, {hi:.3f}]",
        flush=True)
  return report


if __name__ == "__main__":
  from absl import app
  from dockyard import launch
  argv = list(sys.argv)
  if not any(a.startswith("--config.run.mode") for a in argv):
    argv.append("--config.run.mode=eval")
  app.run(launch.main, argv=argv, flags_parser=launch.parse_flags)
