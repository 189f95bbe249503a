"""configs/distill.py end to end through `python -m dockyard.launch`: the GRPO loop (Ray, the CPU
vLLM engine, refit with the canary) with the distillation update, a few steps. The student and
the teachers here are tiny local models: one that shares the student's tokenizer, and one with
another (trained here with fewer merges), aligned on text spans (the config's default teacher,
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


def test_distill_selects_between_teachers_with_another_tokenizer(tmp_path):
  """Two teachers, one with the student's tokenizer and one with another vocabulary (512 tokens
  where the student has 1024: other cuts of the same text), one chosen per prompt
  (combine='select'), on the sampled-token estimator: one step."""
  from transformers import AutoTokenizer
  student = dict(tiny.DEFAULT_SPEC)
  same = tiny.make_tiny_model(student, seed=1)
  other = tiny.make_tiny_model({**student, "vocab_size": 512}, seed=2)
  assert AutoTokenizer.from_pretrained(other).get_vocab() != AutoTokenizer.from_pretrained(same).get_vocab()
  tiny_args = [f"--config.policy.tiny.{k}={v}" for k, v in student.items() if k != "tokenizer_from"]
  workdir = str(tmp_path / "distill")
  _, rows = launch(workdir, "--config=configs/distill.py", *tiny_args, "--config.policy.tiny.tokenizer_from=",
                   f"--config.grpo.distill.teachers=('{same}', '{other}')", "--config.grpo.distill.combine=select",
                   "--config.grpo.distill.loss=sampled_token", "--config.grpo.max_num_steps=1",
                   "--config.grpo.val_period=0", "--config.logging.png_curve=False")
  steps = [r for r in rows if "reward/raw_mean" in r]
  assert [r["step"] for r in steps] == [1]
  r = steps[0]
  print({k: v for k, v in r.items() if k.startswith("distill/")})
  assert r["train/sequences"] == 32 and math.isfinite(r["train/loss"]) and math.isfinite(r["distill/reverse_kl"])
  # 8 prompts, each given to one teacher
  assert r["distill/selected_teacher_0"] + r["distill/selected_teacher_1"] == 1.0
  assert (r["distill/selected_teacher_0"] * 8).is_integer()
  # the other tokenizer's teacher scored (nearly) every student token through a span
  assert r["distill/teacher1/unaligned_frac"] < 0.05
  assert r["distill/teacher1/student_tokens_per_span"] >= 1.0
  assert "distill/teacher0/unaligned_frac" not in r   # the same tokenizer: scored as it is
