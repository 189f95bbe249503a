"""configs/dpo.py, configs/rlaif.py and configs/online_dpo.py end to end through `python -m dockyard.launch`.

configs/dpo.py (no Ray, no engines: the trainer, its frozen reference and the pairs): the tiny
default learns on held-out pairs with the JAX trainer, and the torch trainer runs a couple of steps
on a user's TRL-schema JSONL, then resumes. configs/rlaif.py makes its pairs with the model (an
in-process CPU vLLM engine), trains on them and resumes on them. configs/online_dpo.py (the GRPO loop with the
preference step): a few steps through Ray, the CPU vLLM engine and the refit canary.

The JAX run is the config's default (100 steps of DPO + the chosen NLL on the math pairs, ~1 minute
here). Measured on seeds 0 / 1 / 2 (docs/dpo.md): held-out val/chosen_preferred 0.55 -> 0.80,
0.55 -> 0.80, 0.45 -> 0.75; val/preference_loss 0.693 -> 0.638 / 0.632 / 0.640; val/reward_accuracy
0 -> 0.70 / 0.80 / 0.55. The margins asserted are below the smallest of those. A loop that does not
train (a loss with the wrong sign, rows not interleaved as the loss reads them, the reference
trained along) stays near its step-0 values or gets worse.
"""
import json
import math
import os

from tests.integration.launched import launch

MIN_PREFERRED_GAIN = 0.15   # val/chosen_preferred, last validation - step 0 (3 of the 20 pairs)
MIN_LOSS_DROP = 0.03        # val/preference_loss, step 0 (log 2) - last validation


def test_tiny_dpo_learns_on_held_out_pairs(tmp_path):
  workdir = str(tmp_path / "dpo")
  proc, rows = launch(workdir, "--config=configs/dpo.py")
  train = [r for r in rows if "train/loss" in r]
  val = [r for r in rows if "val/preference_loss" in r]
  assert [r["step"] for r in train] == list(range(1, 101))
  assert [r["step"] for r in val] == [0, 25, 50, 75, 100]
  assert all(math.isfinite(r["train/loss"]) and r["time/reference"] > 0 for r in train)
  first, last = val[0], val[-1]
  assert first["val/reward_accuracy"] == 0.0 and abs(first["val/preference_loss"] - math.log(2)) < 1e-4
  print(f"val/chosen_preferred {first['val/chosen_preferred']:.2f} -> {last['val/chosen_preferred']:.2f}, "
        f"val/preference_loss {first['val/preference_loss']:.3f} -> {last['val/preference_loss']:.3f}, "
        f"val/reward_accuracy -> {last['val/reward_accuracy']:.2f}")
  assert last["val/chosen_preferred"] - first["val/chosen_preferred"] >= MIN_PREFERRED_GAIN - 1e-9
  assert first["val/preference_loss"] - last["val/preference_loss"] >= MIN_LOSS_DROP
  assert last["val/reward_accuracy"] > first["val/reward_accuracy"]
  assert "dpo_tiny: summary" in proc.stdout
  assert os.path.exists(os.path.join(workdir, "checkpoints", "latest", "loop_state.json"))


def test_torch_backend_on_a_jsonl_of_pairs_with_the_generation_metric(tmp_path):
  """The torch trainer on a user's TRL-schema JSONL, with `dpo.generate_period`: an in-process CPU
  vLLM engine fed the policy's weights (the refit canary checks them) samples greedy pass@1 on
  env.math's held-out tasks at steps 0 and 2, and at the end of the resumed run (step 3)."""
  pairs = [{"prompt": f"What is {a} + {b}?", "chosen": str(a + b), "rejected": str(a + b + 1)}
           for a in range(4) for b in range(4)]
  for name, part in (("train", pairs[:12]), ("val", pairs[12:])):
    (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(p) + "\n" for p in part))
  workdir = str(tmp_path / "run")
  args = ["--config=configs/dpo.py:torch", f"--config.data.train={tmp_path}/train.jsonl",
          f"--config.data.validation={tmp_path}/val.jsonl", "--config.dpo.val_period=2",
          "--config.dpo.num_pairs_per_step=4", "--config.optim.micro_batch_size=4",
          "--config.dpo.generate_period=2", "--config.logging.png_curve=False"]
  _, rows = launch(workdir, *args, "--config.dpo.num_steps=2")
  gen = [r for r in rows if "val/pass@1" in r]
  assert [r["step"] for r in gen] == [0, 2]
  assert all(0.0 <= r["val/pass@1"] <= 1.0 and r["refit/canary/max_abs_logprob_delta"] <= 1e-3 for r in gen)
  train = [r for r in rows if "train/loss" in r]
  val = [r for r in rows if "val/loss" in r]
  assert [r["step"] for r in train] == [1, 2] and [r["step"] for r in val] == [0, 2]
  assert all(math.isfinite(r["train/loss"]) and math.isfinite(r["train/reward_margin"]) for r in train)
  assert all(math.isfinite(r["val/loss"]) for r in val)
  assert abs(train[0]["train/reward_margin"]) < 1e-5   # step 1: the policy is still the reference
  # Again into the same workdir with one more step: it resumes from checkpoints/latest (step 2).
  _, rows = launch(workdir, *args, "--config.dpo.num_steps=3")
  assert [r["step"] for r in rows if "train/loss" in r] == [1, 2, 3]
  assert [r["step"] for r in rows if "val/loss" in r] == [0, 2, 3]   # the end validates
  assert [r["step"] for r in rows if "val/pass@1" in r] == [0, 2, 3]


def test_online_dpo_runs_through_the_launcher(tmp_path):
  """configs/online_dpo.py (the GRPO loop: Ray, the CPU vLLM engine, refit with the canary) with
  the preference step: a few steps of the tiny default, the reference built from the warm start."""
  workdir = str(tmp_path / "online")
  proc, rows = launch(workdir, "--config=configs/online_dpo.py", "--config.grpo.sft_warmup.steps=20",
                      "--config.grpo.max_num_steps=3", "--config.grpo.val_period=3",
                      "--config.logging.png_curve=False")
  steps = [r for r in rows if "reward/raw_mean" in r]
  assert [r["step"] for r in steps] == [1, 2, 3]
  trained = [r for r in steps if not r.get("train/skipped")]
  assert trained, "no step had a group with distinct rewards"
  for r in trained:
    assert r["train/pairs"] >= 1 and math.isfinite(r["train/preference_loss"])
    assert math.isfinite(r["refit/canary/max_abs_logprob_delta"])   # the canary checked the refit
  # Step 1's policy is the reference (the warm-started weights): every implicit reward is 0.
  if not steps[0].get("train/skipped"):
    assert abs(steps[0]["train/reward_margin"]) < 1e-4
  assert [r["step"] for r in rows if "val/accuracy" in r] == [0, 3]
  assert os.path.isdir(os.path.join(workdir, "checkpoints", "reference"))


def test_rlaif_makes_its_pairs_trains_and_resumes_on_them(tmp_path):
  """configs/rlaif.py: the in-process engine writes the tiny model's answers, critiques and revisions,
  the DPO loop trains on revision-over-answer pairs; a resumed run reads the same pairs back."""
  workdir = str(tmp_path / "rlaif")
  args = ["--config=configs/rlaif.py", "--config.rlaif.num_train_prompts=16", "--config.rlaif.num_val_prompts=8",
          "--config.dpo.val_period=2", "--config.dpo.num_pairs_per_step=4", "--config.optim.micro_batch_size=8",
          "--config.logging.png_curve=False"]
  proc, rows = launch(workdir, *args, "--config.dpo.num_steps=2")
  with open(os.path.join(workdir, "rlaif_pairs.jsonl")) as f:
    records = [json.loads(line) for line in f]
  assert [r["split"] for r in records] == ["train"] * 16 + ["validation"] * 8
  assert all(r["answer"] != r["revision"] for r in records if r["kept"]) and sum(r["kept"] for r in records) >= 12
  assert "rlaif:" in proc.stdout
  assert [r["step"] for r in rows if "train/loss" in r] == [1, 2]
  assert [r["step"] for r in rows if "val/chosen_preferred" in r] == [0, 2]
  mtime = os.path.getmtime(os.path.join(workdir, "rlaif_pairs.jsonl"))
  proc, rows = launch(workdir, *args, "--config.dpo.num_steps=3")
  assert [r["step"] for r in rows if "train/loss" in r] == [1, 2, 3]
  assert os.path.getmtime(os.path.join(workdir, "rlaif_pairs.jsonl")) == mtime and "rlaif:" not in proc.stdout
