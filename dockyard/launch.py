r"""The entry point: `python -m dockyard.launch --config=configs/swe.py[:ARG] --config.a.b=v --workdir=DIR`.

Validates the config (unknown keys, types, cross-field rules) before any model loads, writes the
workdir, prints the run plan, then builds the parts and runs the loop (`dockyard.runner`) with
the output teed into `<workdir>/run.log` and third-party noise kept off the terminal
(`dockyard.console`).
"""
from __future__ import annotations

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from dockyard import console
from dockyard import plan as plan_lib
from dockyard import validate, workdir as workdir_lib

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file[:arg].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where config.json, metrics, TensorBoard and "
                               "checkpoints go; re-running into it resumes.")


def _config_spec(argv) -> str | None:
  for i, a in enumerate(argv):
    if a.startswith("--config="):
      return a.split("=", 1)[1]
    if a == "--config" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def parse_flags(argv):
  """Checks `--config.*` overrides against the config file first, so a typo names its key."""
  spec = _config_spec(argv)
  if spec is None:
    sys.exit("error: --config=configs/<experiment>.py[:arg] is required")
  try:
    validate.check_overrides(validate.load_config_file(spec), argv[1:])
    return flags.FLAGS(argv)
  except (validate.ConfigError, ValueError) as e:
    sys.exit(f"error: {e}")
  except flags.Error as e:
    sys.exit(f"error: {e}")


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)   # orbax/absl INFO lines drown the progress line; -v 0 brings them back
  config = _CONFIG.value
  try:
    validate.validate(config)
  except validate.ConfigError as e:
    sys.exit(f"error: {e}")
  plan = plan_lib.make_plan(config)
  print(plan.render(), flush=True)
  if config.run.dry_run:
    return
  workdir = _WORKDIR.value or f"workdirs/{config.run.name}"
  paths = workdir_lib.prepare(workdir, config)
  logging.info("workdir: %s", paths["workdir"])
  print(f"full output (Ray, vLLM, warnings): {paths['log']}", flush=True)
  with console.capture(paths["log"]):
    from dockyard import runner  # heavy imports (JAX, Ray, vLLM) only after validation
    runner.run(config, paths)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
