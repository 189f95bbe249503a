r"""The command line of the SWE task-set builder (`dockyard.data.swe_tasks`).

  python -m dockyard.data.build_swe_tasks                    # build data/swe/ (seed 0)
  python -m dockyard.data.build_swe_tasks --setup_repos      # only make the git repos the tasks need
  python -m dockyard.data.build_swe_tasks --out=/tmp/swe --work_dir=/tmp/swe_work --fresh   # reproduce

One absl flag per field of `swe_tasks.options.Options` (its default and help are the flag's), plus
`--setup_repos`, which builds nothing and re-makes the repos the task files under `--out` name.
"""
from __future__ import annotations

import dataclasses
import sys
import typing
from typing import Sequence

from absl import flags

from dockyard.data.swe_tasks import manifest, task_set
from dockyard.data.swe_tasks.options import Options

_DEFINE = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float,
           str: flags.DEFINE_string, tuple[str, ...]: flags.DEFINE_multi_string}


def define_flags(flag_values: flags.FlagValues) -> None:
  """One flag per `Options` field, and `--setup_repos`, on `flag_values`."""
  types = typing.get_type_hints(Options)
  for f in dataclasses.fields(Options):
    default = list(f.default) if isinstance(f.default, tuple) else f.default
    _DEFINE[types[f.name]](f.name, default, f.metadata["help"], flag_values=flag_values)
  flags.DEFINE_bool("setup_repos", False, "only fetch the sdists and make the repos the task files under "
                    "--out name; builds nothing", flag_values=flag_values)
  flags.DEFINE_bool("help", False, "show this help", flag_values=flag_values)


def parse(argv: Sequence[str]) -> tuple[Options, bool]:
  """(the options, whether only --setup_repos) from command-line arguments (no program name)."""
  fv = flags.FlagValues()
  define_flags(fv)
  try:
    rest = fv(["build_swe_tasks", *argv])
  except flags.Error as e:
    raise SystemExit(f"error: {e}")
  if fv.help:
    print(__doc__ + "\n" + fv.get_help())
    raise SystemExit(0)
  if len(rest) > 1:
    raise SystemExit(f"error: unexpected arguments {rest[1:]} (options are --name=value)")
  try:
    opts = Options(**{f.name: fv[f.name].value for f in dataclasses.fields(Options)})
  except ValueError as e:
    raise SystemExit(f"error: {e}")
  return opts, fv.setup_repos


def main(argv: Sequence[str] | None = None) -> int:
  opts, setup_only = parse(sys.argv[1:] if argv is None else argv)
  if setup_only:
    manifest.setup_repos(opts.out, opts.repos_dir)
  else:
    task_set.build(opts)
  return 0


if __name__ == "__main__":
  sys.exit(main())
