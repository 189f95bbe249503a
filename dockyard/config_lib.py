"""Small helpers that experiment configs share: parsing the `:arg` string.

`--config=configs/swe.py:tiny` or `--config=configs/swe.py:full,num_nodes=2` reach
`get_config(arg)` as the string after the colon; `parse_arg` turns it into a ConfigDict of
typed values (like big_vision's `bvcc.parse_arg`).
"""
from __future__ import annotations

import ml_collections


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """Parses 'a,b=3,c=x' into {a: True, b: 3, c: 'x'} on top of typed `defaults`.

  A bare word sets the boolean default of that name; unknown names are an error.
  """
  out = ml_collections.ConfigDict(defaults)
  if not arg:
    return out
  for item in arg.split(","):
    item = item.strip()
    if not item:
      continue
    if "=" in item:
      key, value = item.split("=", 1)
    else:
      key, value = item, "True"
    if key not in defaults:
      raise ValueError(
          f"Unknown config argument {key!r} in {arg!r}; known: {sorted(defaults)}")
    kind = type(defaults[key])
    if kind is bool:
      if value not in ("True", "False", "true", "false", "1", "0"):
        raise ValueError(f"Config argument {key!r} must be a boolean, got {value!r}")
      out[key] = value in ("True", "true", "1")
    else:
      try:
        out[key] = kind(value)
      except ValueError as e:
        raise ValueError(f"Config argument {key!r} must be {kind.__name__}, got {value!r}") from e
  return out


def train_steps(config) -> int:
  """The optimizer steps the config's loop runs: `grpo.max_num_steps`, or `dpo.num_steps` for a
  preference run, or `sft.num_steps` for an SFT run (configs/dpo.py and configs/sft.py have no
  grpo section); 0 when none is set. The trainers size
  their learning-rate schedule with it when `optim.decay_steps` is 0."""
  for section, key in (("grpo", "max_num_steps"), ("dpo", "num_steps"), ("sft", "num_steps")):
    if section in config and key in config[section]:
      return int(config[section][key])
  return 0
