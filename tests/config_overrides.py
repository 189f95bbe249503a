"""A shipped config with dotted-key overrides, as tests set them (`{"grpo.preference.mode": "ipo"}`),
and the check that validation refuses a config naming the key."""
import os

import pytest

from dockyard import validate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def set_dotted(config, overrides: dict) -> None:
  """Sets each dotted key of `overrides` in `config`."""
  for dotted, value in overrides.items():
    node = config
    *path, last = dotted.split(".")
    for p in path:
      node = node[p]
    node[last] = value


def with_overrides(spec: str, overrides: dict):
  """`configs/<file>.py[:arg]` (relative to the repo) loaded, then each dotted key set; not validated."""
  config = validate.load_config_file(os.path.join(ROOT, spec))
  set_dotted(config, overrides)
  return config


def rejects(config, key: str, match: str) -> None:
  """`validate.validate(config)` raises a ConfigError whose message matches `match`, naming `key`."""
  with pytest.raises(validate.ConfigError, match=match) as err:
    validate.validate(config)
  assert err.value.key == key
