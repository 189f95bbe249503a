"""configs/sft.py end to end through `python -m dockyard.launch` (no Ray: the JAX trainer, the chats,
and the generation metric's vLLM engine in the same process): the held-out loss falls, greedy
pass@1 is measured on the held-out sums through GRPO's validation path after a refit (the canary
checks the engine got the trained weights), and a second launch into the workdir resumes from
checkpoints/latest.

A shortened default (20 steps, then 5 more on resume). Measured on the full default (100 steps,
docs/sft.md): held-out loss 7.05 -> 0.64; at step 20 it is 2.36 on every seed here (the model is
made from the seed, and the data is fixed). A loop that does not train (a mask on the prompt
instead of the answer, a learning rate of 0, a resume that restarts from the initial weights) stays
near the step-0 loss of ~7 or jumps back to it.
"""
import math
import os
import time

import pytest

from tests.integration.launched import launch

pytestmark = pytest.mark.slow

MAX_LOSS_AT_20 = 4.0   # held-out NLL per answer token after 20 steps (measured 2.36; 7.05 at 0)


def _launch(workdir, *args, config="configs/sft.py"):
  t0 = time.perf_counter()
  out = launch(workdir, f"--config={config}", "--config.logging.png_curve=False",
               "--config.sft.val_period=10", "--config.checkpoint.save_period=10", *args)
  print(f"launch {' '.join(args)}: {time.perf_counter() - t0:.0f} s")
  return out


def test_tiny_sft_lowers_held_out_loss_and_resumes(tmp_path):
  workdir = str(tmp_path / "sft")
  proc, rows = _launch(workdir, "--config.sft.num_steps=20", "--config.sft.generate_period=20")
  train = [r for r in rows if "train/loss" in r]
  val = [r for r in rows if "val/loss" in r]
  gen = [r for r in rows if "val/pass@1" in r]
  assert [r["step"] for r in train] == list(range(1, 21))
  assert [r["step"] for r in val] == [0, 10, 20] and [r["step"] for r in gen] == [0, 20]
  assert all(math.isfinite(r["train/loss"]) for r in train)
  first, last = val[0]["val/loss"], val[-1]["val/loss"]
  print(f"val/loss {first:.3f} -> {last:.3f}; pass@1 {gen[0]['val/pass@1']} -> {gen[-1]['val/pass@1']}")
  assert first > 6.0 and last < MAX_LOSS_AT_20 and val[1]["val/loss"] < first
  assert all(r["val/tokens"] == val[0]["val/tokens"] > 20 for r in val)   # 20 answers + their EOS
  for r in gen:   # the engine sampled with the trainer's weights, and the env scored every task
    assert r["refit/canary/max_abs_logprob_delta"] <= 1e-3
    assert 0.0 <= r["val/pass@1"] <= 1.0 and r["val/completion_len_mean"] > 0
  assert "sft_tiny: summary (sft, jax)" in proc.stdout
  assert os.path.exists(os.path.join(workdir, "checkpoints", "latest", "loop_state.json"))

  # Again into the same workdir with 5 more steps and no engine: it resumes at step 20.
  _, rows = _launch(workdir, "--config.sft.num_steps=25", "--config.sft.generate_period=0")
  train = [r for r in rows if "train/loss" in r]
  val = [r for r in rows if "val/loss" in r]
  assert [r["step"] for r in train] == list(range(1, 26))   # no step trained twice
  assert [r["step"] for r in val] == [0, 10, 20, 25]         # no second step-0 validation
  assert train[20]["train/loss"] < MAX_LOSS_AT_20            # step 21 starts from the trained weights
  assert val[-1]["val/loss"] < val[-2]["val/loss"]


def test_torch_backend_beside_the_engine(tmp_path):
  """`:torch`: the torch trainer and the vLLM engine share a process (and torch.distributed: the
  trainer's one-rank gloo group, vLLM's own groups); the run trains, samples after a refit, and
  exits cleanly (the engine is shut down before the trainer destroys every group at exit)."""
  workdir = str(tmp_path / "sft_torch")
  proc, rows = _launch(workdir, "--config.sft.num_steps=4", "--config.sft.val_period=2",
                       "--config.sft.generate_period=4", config="configs/sft.py:torch")
  assert [r["step"] for r in rows if "train/loss" in r] == [1, 2, 3, 4]
  val = [r["val/loss"] for r in rows if "val/loss" in r]
  assert len(val) == 3 and val[-1] < val[0]
  assert all(r["refit/canary/max_abs_logprob_delta"] <= 1e-3 for r in rows if "val/pass@1" in r)
  assert "sft_tiny: summary (sft, torch)" in proc.stdout
  assert "Invalid process group" not in proc.stderr and "Traceback" not in proc.stderr
