"""configs/rm.py end to end through `python -m dockyard.launch` (no Ray, no engines): the tiny
default (JAX) and `:torch` train a reward model whose held-out pair accuracy goes from what the
random head gives to nearly all pairs, and the saved model then scores the math env's held-out
tasks as a GRPO environment (`envs.reward_model.RewardModelEnv`) and rewards two GRPO steps of
configs/math.py through the launcher.

The default pairs prefer the gold answer ("7") to the same answer in words ("seven"), which the
env cannot parse (docs/rm.md). Measured here: held-out val/accuracy 0.15 -> 1.00 (JAX, 20 steps)
and 0.50 -> 1.00 (torch, 10 steps; the test runs 12), val/loss 0.70 -> 0.00. A head read at the wrong place, a loss with the
wrong sign or rows not interleaved as the loss reads them stay near chance or go to 0.
"""
import asyncio
import math
import os

import numpy as np
import transformers

from tests.integration.launched import launch

MIN_ACCURACY = 0.9    # val/accuracy at the last validation: 18 of the 20 held-out pairs


def _check_learning(rows, steps):
  train = [r for r in rows if "train/loss" in r]
  val = [r for r in rows if "val/accuracy" in r]
  assert [r["step"] for r in train] == list(range(1, steps + 1))
  assert all(math.isfinite(r["train/loss"]) and r["train/grad_norm"] > 0 for r in train)
  first, last = val[0], val[-1]
  assert last["step"] == steps, "the run must end on a validation of its final weights"
  assert first["step"] == 0 and abs(first["val/loss"] - math.log(2)) < 0.05   # a fresh head: ~ chance
  print(f"val/accuracy {first['val/accuracy']:.2f} -> {last['val/accuracy']:.2f}, "
        f"val/loss {first['val/loss']:.3f} -> {last['val/loss']:.3f}")
  assert first["val/accuracy"] < MIN_ACCURACY <= last["val/accuracy"]
  assert last["val/loss"] < first["val/loss"] - 0.3 and last["val/reward_margin"] > 1.0


def test_tiny_rm_learns_and_scores_the_math_env(tmp_path):
  workdir = str(tmp_path / "rm")
  proc, rows = launch(workdir, "--config=configs/rm.py")
  _check_learning(rows, 20)
  assert "rm_tiny: summary" in proc.stdout
  # The saved reward model as the math GRPO config's reward (env.reward_model.path), built as the
  # runner builds it, scored on the held-out tasks.
  import contextlib
  from configs import math as math_config
  from dockyard import runner, validate
  from dockyard.envs.reward_model import RewardModelEnv
  from dockyard.rm.data import in_words
  config = math_config.get_config("tiny")
  config.env.reward_model.path = os.path.join(workdir, "reward_model")
  validate.validate(config)
  tokenizer = transformers.AutoTokenizer.from_pretrained(runner.resolve_model(config))
  with contextlib.ExitStack() as stack:
    base, _, val_tasks, _ = runner.build_env(config, tokenizer, stack)
  env = runner.reward_model_env(config, base)
  assert isinstance(env, RewardModelEnv) and env.base is base
  tasks = val_tasks

  async def score(texts):
    return await asyncio.gather(*[env.score(t, x) for t, x in zip(tasks, texts)])
  gold = asyncio.run(score([str(t["answer"]) for t in tasks]))
  words = asyncio.run(score([in_words(t["answer"]) for t in tasks]))
  assert np.mean([g.value > w.value for g, w in zip(gold, words)]) >= MIN_ACCURACY
  assert all(env.is_success(g) for g in gold) and not any(env.is_success(w) for w in words)
  assert env.batches_scored == 2

  # GRPO through the launcher with that reward model as the math env's reward (Ray, the CPU vLLM
  # engine, refit with the canary): its training reward is the model's scalar, its validation the
  # env's own verdict.
  _, rows = launch(str(tmp_path / "grpo_rm"), "--config=configs/math.py",
                   f"--config.env.reward_model.path={config.env.reward_model.path}",
                   "--config.grpo.sft_warmup.steps=20", "--config.grpo.max_num_steps=2",
                   "--config.grpo.val_period=2", "--config.logging.png_curve=False")
  steps = [r for r in rows if "reward/raw_mean" in r]
  assert [r["step"] for r in steps] == [1, 2]
  assert all(math.isfinite(r["reward/raw_mean"]) and r["reward/raw_std"] > 0 for r in steps)
  # The model's scalar, not the verifier's 0 / 1: a mean of 16 x 8 binary rewards is a multiple of 1/128.
  assert any(abs(r["reward/raw_mean"] * 128 - round(r["reward/raw_mean"] * 128)) > 1e-3 for r in steps)
  assert [r["step"] for r in rows if "val/accuracy" in r] == [0, 2]


def test_torch_backend_learns(tmp_path):
  # 12 steps, validated every 5: at 0, 5, 10 and the last, 12
  _, rows = launch(str(tmp_path / "rm_torch"), "--config=configs/rm.py:torch", "--config.rm.num_steps=12")
  _check_learning(rows, 12)
  assert [r["step"] for r in rows if "val/accuracy" in r] == [0, 5, 10, 12]
