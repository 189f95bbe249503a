"""configs/distill.py end to end through `python -m dockyard.launch`: the GRPO loop (Ray, the CPU
vLLM engine, refit with the canary) with the distillation update, a few steps. The student and
the teacher here are two tiny local models that share a tokenizer (the config's default teacher,
SmolLM2-135M, is measured in docs/distill.md, not in CI)."""
import math

from dockyard.models import tiny
from tests.integration.launched import launch


def test_distill_runs_through_the_launcher(tmp_path):
  student = dict(tiny.DEFAULT_SPEC)
  teacher = tiny.make_tiny_model(student, seed=1)   # the same tokenizer, other weights
  tiny_args = [f"--config.policy.tiny.{k}={v}" for k, v in student.items() if k != "tokenizer_from"]
  workdir = str(tmp_path / "distill")
  _, rows = launch(workdir, "--config=configs/distill.py", *tiny_args,
                   "--config.policy.tiny.tokenizer_from=", f"--config.grpo.distill.teachers=('{teacher}',)",
                   "--config.grpo.max_num_steps=2", "--config.grpo.val_period=2",
                   "--config.grpo.max_val_samples=8", "--config.logging.png_curve=False")
  steps = [r for r in rows if "reward/raw_mean" in r]
  assert [r["step"] for r in steps] == [1, 2]
  for r in steps:
    assert r["train/sequences"] == 32   # 8 prompts x 4 samples: flat groups train too
    # Two different random models: the top-k KL (the default loss) is above 0.
    assert r["train/topk_kl"] > 0 and math.isfinite(r["train/loss"])
    assert 0 < r["train/topk_student_mass"] < 1 and 0 < r["distill/teacher_topk_mass"] < 1
    assert math.isfinite(r["refit/canary/max_abs_logprob_delta"])
  assert [r["step"] for r in rows if "val/pass@1" in r] == [0, 2]
