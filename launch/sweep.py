r"""Runs the sweep a config defines in `get_hyper(h, arg)` (`arg`: the `:arg` of --config).

  python -m launch.sweep --config=configs/swe.py:tiny --dry_run          # one line per trial
  python -m launch.sweep --config=configs/swe.py:tiny --workdir=sweeps/x  # run trials one by one
  python -m launch.sweep --config=configs/swe.py:full --executor=ray      # submit each as a Ray job

Each trial runs `python -m dockyard.launch --config=<spec> <trial overrides> --workdir=<root>/<i>-<name>`
so it goes through the same validation; its own workdir holds its config.json and metrics.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys

from absl import app, flags

from dockyard import sweep as h
from dockyard import validate

_CONFIG = flags.DEFINE_string("config", None, "Config file[:arg] whose get_hyper(h, arg) defines the sweep.")
_WORKDIR = flags.DEFINE_string("workdir", "sweeps", "Root; each trial gets <workdir>/<index>-<name>.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the trials and their overrides; run nothing.")
_EXECUTOR = flags.DEFINE_enum("executor", "local", ["local", "ray"], "local: one after another; "
                              "ray: submit each trial as a Ray job to --ray_address.")
_RAY_ADDRESS = flags.DEFINE_string("ray_address", "http://127.0.0.1:8265", "Ray job submission address.")
_EXTRA = flags.DEFINE_multi_string("override", [], "Extra --config.* overrides for every trial.")


def load_trials(spec: str) -> list[h.Trial]:
  path = spec.partition(":")[0]
  module = validate.load_config_module(path)
  if not hasattr(module, "get_hyper"):
    raise SystemExit(f"error: {path} defines no get_hyper(h, arg)")
  return module.get_hyper(h, spec.partition(":")[2] or None)   # the variant the trials run


def trial_commands(spec: str, root: str, extra: list[str]) -> list[tuple[str, list[str]]]:
  config = validate.load_config_file(spec)
  out = []
  for i, trial in enumerate(load_trials(spec)):
    overrides = h.to_flags(trial) + list(extra)
    validate.check_overrides(config, overrides)  # a typo in get_hyper fails before any trial runs
    workdir = os.path.join(root, f"{i:03d}-{h.trial_name(trial)}")
    cmd = [sys.executable, "-m", "dockyard.launch", f"--config={spec}", *overrides, f"--workdir={workdir}"]
    out.append((workdir, cmd))
  return out


def main(argv):
  del argv
  if not _CONFIG.value:
    raise SystemExit("error: --config is required")
  try:
    commands = trial_commands(_CONFIG.value, _WORKDIR.value, _EXTRA.value)
  except validate.ConfigError as e:
    raise SystemExit(f"error: {e}")
  print(f"{len(commands)} trials from {_CONFIG.value}")
  for i, (workdir, cmd) in enumerate(commands):
    overrides = [c for c in cmd if c.startswith("--config.")]
    print(f"[{i}] {' '.join(overrides)}  workdir={workdir}")
  if _DRY_RUN.value:
    return
  if _EXECUTOR.value == "ray":
    from ray.job_submission import JobSubmissionClient
    client = JobSubmissionClient(_RAY_ADDRESS.value)
    for workdir, cmd in commands:
      entry = " ".join(shlex.quote(c) for c in ["python", *cmd[1:]])
      job = client.submit_job(entrypoint=entry, runtime_env={"working_dir": "."})
      print(f"submitted {job}: {workdir}")
    return
  failed = 0
  for i, (workdir, cmd) in enumerate(commands):
    print(f"=== trial {i}/{len(commands)}: {workdir}", flush=True)
    failed += subprocess.run(cmd).returncode != 0
  if failed:
    raise SystemExit(f"{failed} of {len(commands)} trials failed")


if __name__ == "__main__":
  app.run(main)
