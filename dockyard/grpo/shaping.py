"""Reward shaping (`config.grpo.reward_shaping`): the environment's raw reward -> the trained reward.

  shaped = scale * raw - malformed_penalty * [malformed] - overlong(length)

Penalties are magnitudes (>= 0) that are subtracted. `overlong` is DAPO's soft overlong
punishment with L = max_new_tokens, B = overlong_buffer, P = overlong_penalty:
  length <= L - B       -> 0
  L - B < length <= L   -> P * (length - (L - B)) / B     (a linear ramp up to P)
  length > L            -> P
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ShapingConfig:
  scale: float = 1.0
  malformed_penalty: float = 0.0
  overlong_penalty: float = 0.0
  overlong_buffer: int = 0
  max_new_tokens: int = 0

  def __post_init__(self):
    for key in ("malformed_penalty", "overlong_penalty", "overlong_buffer"):
      if getattr(self, key) < 0:
        raise ValueError(f"grpo.reward_shaping.{key} is a penalty magnitude and must be >= 0, "
                         f"got {getattr(self, key)}")
    if self.overlong_penalty > 0 and self.overlong_buffer > self.max_new_tokens:
      raise ValueError(f"grpo.reward_shaping.overlong_buffer ({self.overlong_buffer}) exceeds "
                       f"rollout.max_new_tokens ({self.max_new_tokens})")

  @classmethod
  def from_config(cls, config) -> "ShapingConfig":
    shaping = config.grpo.reward_shaping
    return cls(scale=float(shaping.scale), malformed_penalty=float(shaping.malformed_penalty),
               overlong_penalty=float(shaping.overlong_penalty), overlong_buffer=int(shaping.overlong_buffer),
               max_new_tokens=int(config.rollout.max_new_tokens))


def overlong_penalty(length: int, cfg: ShapingConfig) -> float:
  """DAPO soft overlong punishment (a magnitude, >= 0) for a completion of `length` tokens."""
  if cfg.overlong_penalty == 0:
    return 0.0
  start = cfg.max_new_tokens - cfg.overlong_buffer
  if length <= start:
    return 0.0
  if length > cfg.max_new_tokens or cfg.overlong_buffer == 0:
    return cfg.overlong_penalty
  return cfg.overlong_penalty * (length - start) / cfg.overlong_buffer


def shape_reward(raw: float, malformed: bool, length: int, cfg: ShapingConfig) -> float:
  return (cfg.scale * raw - (cfg.malformed_penalty if malformed else 0.0)
          - overlong_penalty(length, cfg))
