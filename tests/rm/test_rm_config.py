"""configs/rm.py: what validate rejects before any model loads (each error naming its key), the
launch CLI's dry run and typo check on it, and its sweep."""
import os
import subprocess
import sys

import pytest

from configs import rm as rm_config
from dockyard import validate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_shipped_variants_validate():
  for arg in (None, "torch"):
    validate.validate(rm_config.get_config(arg))


@pytest.mark.parametrize("key, value, words", [
    ("policy.backend", "tpu", "must be 'jax' or 'torch'"),
    ("policy.max_seq_len", 1, "must be >= 2"),
    ("rm.num_steps", 0, "must be >= 1"),
    ("rm.num_pairs_per_step", 0, "must be >= 1"),
    ("rm.val_period", -1, "must be >= 0"),
    ("optim.lr", 0.0, "must be > 0"),
    ("optim.weight_decay", -0.1, "must be >= 0"),
    ("optim.max_grad_norm", 0.0, "must be > 0"),
    ("data.train", "/no/such/pairs.jsonl", "no preference pairs file"),
    ("data.validation", "/some/heldout.jsonl", "set with data.train=''"),
    ("env.math.num_train", 0, ""),
])
def test_bad_values_name_their_key(key, value, words):
  config = rm_config.get_config()
  *path, name = key.split(".")
  node = config
  for p in path:
    node = node[p]
  node[name] = value
  with pytest.raises(validate.ConfigError, match=f"config.{key.rsplit('.', 1)[0] if key.startswith('env') else key}"):
    validate.validate(config)
  if words:
    with pytest.raises(validate.ConfigError, match=words):
      validate.validate(config)


def test_launch_dry_run_and_a_typo():
  def launch(*args):
    return subprocess.run([sys.executable, "-m", "dockyard.launch", "--config=configs/rm.py:torch", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT))
  result = launch("--config.run.dry_run=True")
  assert result.returncode == 0, result.stderr
  assert "loop=reward model (Bradley-Terry)" in result.stdout and "backend=torch" in result.stdout
  assert "80 math pairs (gold vs the answer in words" in result.stdout
  result = launch("--config.rm.num_step=5", "--config.run.dry_run=True")
  assert result.returncode != 0 and "did you mean 'rm.num_steps'" in result.stderr, result.stderr


def test_sweep_trials_override_existing_keys():
  from launch import sweep
  commands = sweep.trial_commands("configs/rm.py", "/tmp/sweeps", [])   # check_overrides on each
  assert len(commands) == 3
  assert [c for _, cmd in commands for c in cmd if c.startswith("--config.optim.lr=")] == [
      "--config.optim.lr=0.0005", "--config.optim.lr=0.001", "--config.optim.lr=0.002"]


def test_a_grpo_reward_model_path_is_checked_before_loading(tmp_path):
  from configs import math as math_config
  config = math_config.get_config("tiny")
  validate.validate(config)                       # path '' : the verifier's reward
  config.env.reward_model.path = str(tmp_path / "nothing")
  with pytest.raises(validate.ConfigError, match="config.env.reward_model.path: no reward model"):
    validate.validate(config)
  (tmp_path / "nothing").mkdir()
  (tmp_path / "nothing" / "config.json").write_text("{}")
  config.env.reward_model.batch_size = 0
  with pytest.raises(validate.ConfigError, match="config.env.reward_model.batch_size: must be >= 1"):
    validate.validate(config)
