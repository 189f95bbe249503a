"""The launch CLI: each misconfiguration fails before anything loads, with a message naming the key;
the dry run prints the resolved plan; the sweep lists its trials."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def launch(*args, module="dockyard.launch"):
  return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=120)


@pytest.mark.parametrize("override, key, words", [
    ("--config.grpo.nmu_prompts_per_step=32", "config.grpo.nmu_prompts_per_step",
     "did you mean 'grpo.num_prompts_per_step'"),
    ("--config.optimm.lr=1", "config.optimm.lr", "unknown key"),
    ("--config.grpo.num_prompts_per_step=many", "config.grpo.num_prompts_per_step", "expected int"),
    ("--config.optim.lr=fast", "config.optim.lr", "expected float"),
    ("--config.run.dry_run=maybe", "config.run.dry_run", "expected bool"),
    ("--config.loss_fn.use_importance_sampling_correction=False",
     "config.loss_fn.use_importance_sampling_correction", "requires importance-sampling correction"),
    ("--config.grpo.async_grpo.max_trajectory_age_steps=0",
     "config.grpo.async_grpo.max_trajectory_age_steps", "must be >= 1"),
    ("--config.grpo.num_generations_per_prompt=1", "config.grpo.num_generations_per_prompt",
     "at least 2"),
    ("--config.mesh.shape=(2,2,1)", "config.mesh.shape", "multiplies to 4"),
    ("--config.rollout.top_p=0.9", "config.rollout.top_p", "must be 1.0 in training"),
    ("--config.rollout.temperature=0.0", "config.rollout.temperature", "must be > 0"),
    ("--config.loss_fn.aggregation=sequence", "config.loss_fn.aggregation", "loss_fn.ratio_level"),
    ("--config.loss_fn.normalization=token_mean", "config.loss_fn.normalization", "'constant'"),
])
def test_misconfiguration_names_the_key(override, key, words):
  # async GRPO is on in `full` (and in tiny with grpo.async_grpo.enabled=True)
  result = launch("--config=configs/swe.py", "--config.grpo.async_grpo.enabled=True", override,
                  "--config.run.dry_run=True")
  assert result.returncode != 0
  err = result.stderr.strip().splitlines()[-1]
  assert err.startswith(f"error: {key}"), result.stderr
  assert words in err, result.stderr
  assert "Traceback" not in result.stderr


def test_sync_loop_does_not_need_importance_sampling():
  result = launch("--config=configs/swe.py:sync", "--config.run.dry_run=True",
                  "--config.loss_fn.use_importance_sampling_correction=False")
  assert result.returncode == 0, result.stderr
  assert "loop=sync" in result.stdout


def test_unknown_config_arg_is_an_error():
  result = launch("--config=configs/swe.py:bogus", "--config.run.dry_run=True")
  assert result.returncode != 0
  assert "Unknown config argument 'bogus'" in result.stderr


def test_full_variant_dry_run_prints_the_cluster_plan():
  result = launch("--config=configs/swe.py:full", "--config.grpo.num_prompts_per_step=32",
                  "--config.run.dry_run=True")
  assert result.returncode == 0, result.stderr
  out = result.stdout
  assert "Qwen/Qwen2.5-7B-Instruct" in out
  assert "loop=async" in out
  assert "'fsdp': 24" in out  # 3 trainer nodes x 8 GPUs on the (1, -1, 1) mesh
  assert "trainer   x3   {\"GPU\": 8}" in out and "nodes 0-2" in out
  assert "rollout   x1   {\"GPU\": 8} placement=PACK" in out and "nodes 3-3" in out
  assert "http://localhost:9090" in out


def test_math_dry_run_plans_no_sandbox_and_its_own_data():
  result = launch("--config=configs/math.py", "--config.run.dry_run=True")
  assert result.returncode == 0, result.stderr
  out = result.stdout
  assert "env=math" in out and "80 generated (+, operands 0-9, seed 0)" in out, out
  assert "sandbox" not in out and "data/swe" not in out, out
  swe = launch("--config=configs/swe.py", "--config.run.dry_run=True")
  assert "env=swe" in swe.stdout and "local executor fleet" in swe.stdout and "data/swe" in swe.stdout


def test_sweep_dry_run_lists_trials():
  result = launch("--config=configs/swe.py:tiny", "--dry_run", module="launch.sweep")
  assert result.returncode == 0, result.stderr
  lines = [l for l in result.stdout.splitlines() if l.startswith("[")]
  assert len(lines) == 4
  assert "--config.optim.lr=2.5e-05" in lines[0] and "--config.grpo.num_generations_per_prompt=8" in lines[1]
  workdirs = [l.split("workdir=")[1] for l in lines]
  assert len(set(workdirs)) == 4


def test_sweep_rejects_a_typo_in_get_hyper(tmp_path):
  cfg = tmp_path / "bad.py"
  cfg.write_text(
      "import sys\nsys.path.insert(0, %r)\nfrom configs.swe import get_config\n"
      "def get_hyper(h, arg=None):\n  return h.sweep('config.optim.lrr', [1.0])\n" % ROOT)
  result = launch(f"--config={cfg}", "--dry_run", module="launch.sweep")
  assert result.returncode != 0
  assert "config.optim.lrr" in result.stderr and "did you mean 'optim.lr'" in result.stderr


@pytest.mark.parametrize("override, key, words", [
    ("--config.dpo.beta=0.0", "config.dpo.beta", "must be > 0"),
    ("--config.dpo.mode=kto", "config.dpo.mode", "must be one of"),
    ("--config.dpo.label_smoothing=0.6", "config.dpo.label_smoothing", "must be < 0.5"),
    ("--config.dpo.simpo_gamma=0.5", "config.dpo.simpo_gamma", "mode='simpo' only"),
    ("--config.dpo.num_pairs_per_step=0", "config.dpo.num_pairs_per_step", "must be >= 1"),
    ("--config.optim.micro_batch_size=7", "config.optim.micro_batch_size", "must be even"),
    ("--config.data.train=/no/such/pairs.jsonl", "config.data.train", "no preference pairs file"),
    ("--config.dpo.bta=0.2", "config.dpo.bta", "did you mean 'dpo.beta'"),
])
def test_dpo_misconfiguration_names_the_key(override, key, words):
  result = launch("--config=configs/dpo.py", override, "--config.run.dry_run=True")
  assert result.returncode != 0
  err = result.stderr.strip().splitlines()[-1]
  assert err.startswith(f"error: {key}"), result.stderr
  assert words in err, result.stderr


def test_dpo_dry_run_plans_the_trainer_alone():
  result = launch("--config=configs/dpo.py:mode=simpo,torch", "--config.run.dry_run=True")
  assert result.returncode == 0, result.stderr
  out = result.stdout
  assert "loop=simpo" in out and "backend=torch" in out and "80 math pairs" in out, out
  assert "rollout" not in out and "sandbox" not in out, out
