"""The xmanager-style hyper-parameter helper `h` that configs' `get_hyper(h, arg)` use.

A sweep is a list of trials; a trial is a dict {'config.a.b': value}. `h.sweep(key, values)` is one
axis, `h.product([...])` the Cartesian product, `h.zipit([...])` pairs axes element-wise,
`h.fixed(key, value)` a constant.
"""
from __future__ import annotations

import itertools
from typing import Any, Sequence

Trial = dict[str, Any]


def sweep(key: str, values: Sequence[Any]) -> list[Trial]:
  return [{key: v} for v in values]


def fixed(key: str, value: Any) -> list[Trial]:
  return [{key: value}]


def product(axes: Sequence[list[Trial]]) -> list[Trial]:
  trials = []
  for combo in itertools.product(*axes):
    merged: Trial = {}
    for part in combo:
      merged.update(part)
    trials.append(merged)
  return trials


def zipit(axes: Sequence[list[Trial]]) -> list[Trial]:
  lengths = {len(a) for a in axes}
  if len(lengths) > 1:
    raise ValueError(f"zipit needs axes of equal length, got lengths {[len(a) for a in axes]}")
  return [dict(kv for part in parts for kv in part.items()) for parts in zip(*axes)]


def to_flags(trial: Trial) -> list[str]:
  """{'config.optim.lr': 1e-6} -> ['--config.optim.lr=1e-06']; tuples as comma-free literals."""
  out = []
  for key, value in trial.items():
    if not key.startswith("config."):
      raise ValueError(f"sweep keys must start with 'config.', got {key!r}")
    out.append(f"--{key}={value!r}" if isinstance(value, (tuple, list)) else f"--{key}={value}")
  return out


def trial_name(trial: Trial) -> str:
  return ",".join(f"{k.split('.')[-1]}={v}" for k, v in trial.items()).replace("/", "_")
