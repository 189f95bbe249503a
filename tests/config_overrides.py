"""A shipped config with dotted-key overrides, as tests set them (`{"grpo.preference.mode": "ipo"}`)."""
import os

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
