"""The task builder's options are declared once (`swe_tasks.options.Options`): the CLI's flags are
made from its fields, so a field cannot lack a flag, a default cannot differ, and bad values stop
the build with the field's name."""
import dataclasses

import pytest
from absl import flags

from dockyard.data import build_swe_tasks
from dockyard.data.swe_tasks.options import Options


def test_every_option_is_a_flag_with_its_default_and_help():
  fv = flags.FlagValues()
  build_swe_tasks.define_flags(fv)
  fields = {f.name: f for f in dataclasses.fields(Options)}
  assert set(fv) == set(fields) | {"setup_repos", "help"}
  for name, f in fields.items():
    want = list(f.default) if isinstance(f.default, tuple) else f.default
    assert fv[name].default == want, name
    assert fv[name].help.startswith(f.metadata["help"]), name   # multi flags add a line


def test_parse_gives_the_options_and_repeats_only():
  opts, setup_only = build_swe_tasks.parse(["--only=inflection", "--only=toolz", "--max_kept=2",
                                            "--timeout_s=5", "--fresh"])
  assert opts == Options(only=("inflection", "toolz"), max_kept=2, timeout_s=5.0, fresh=True)
  assert not setup_only
  assert build_swe_tasks.parse([]) == (Options(), False)   # a second parse starts from the defaults
  assert build_swe_tasks.parse(["--setup_repos"])[1]


@pytest.mark.parametrize("argv, says", [
    (["--runs=0"], "Options.runs must be >= 1"),
    (["--max-kept=2"], "max_kept"),              # absl's "did you mean"
    (["--max_candidates=many"], "max_candidates"),
    (["stray"], "unexpected arguments ['stray']"),
])
def test_bad_arguments_stop_with_the_name(argv, says):
  with pytest.raises(SystemExit, match="error: ") as e:
    build_swe_tasks.parse(argv)
  assert says in str(e.value)


def test_options_reject_bad_values_outside_the_cli():
  with pytest.raises(ValueError, match="Options.timeout_s must be > 0"):
    Options(timeout_s=0)
