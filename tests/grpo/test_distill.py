"""On-policy distillation (`grpo.objective='distill'`, configs/distill.py, dockyard/distill.py): the
per-token advantages from the teachers' logprobs, checked by hand; and the GRPO loop with the
distillation update on the fakes of `grpo_fakes.py`, where a teacher that prefers digits must pull
the bigram student's reward up and the reverse KL down, with no reward signal in the update."""
import json
import os

import numpy as np
import pytest

from dockyard import validate
from dockyard.distill import distill_update, token_advantages
from dockyard.envs.math import MathConfig
from dockyard.policy import TrainBatch

from grpo_fakes import BigramPolicy, FirstDigitEnv, math_config, run_grpo
from test_grpo_loop import _parts
from tests.config_overrides import with_overrides


class Fixed:
  """A teacher whose logprobs are given."""
  def __init__(self, lp):
    self.lp = np.asarray(lp, np.float32)

  def logprobs(self, batch):
    return self.lp


def test_token_advantages_are_the_teachers_minus_the_students_logprob():
  m = np.array([[0, 1, 1, 0], [0, 0, 1, 1]], np.float32)
  batch = TrainBatch(np.zeros((2, 4), np.int32), np.ones((2, 4), np.int32), m,
                     {"prev_logprobs": np.array([[0, -1, -2, 0], [0, 0, -0.5, -3]], np.float32) * m,
                      "advantages": np.array([1.0, -1.0], np.float32)})
  t1, t2 = Fixed([[-9, -2, -1, -9], [-9, -9, -1, -1]]), Fixed([[-9, -4, -1, -9], [-9, -9, -3, -1]])
  student = Fixed(batch.extras["prev_logprobs"])
  extras, metrics = token_advantages(batch, student, [t1, t2], [0.5, 0.5], reward_weight=0.0)
  adv = extras["advantages"]
  # target = mean of the teachers; d = student - target on the loss tokens; its token mean is the
  # reverse-KL estimate, and the advantage is mean(d) - d there, 0 elsewhere.
  assert metrics["distill/reverse_kl"] == pytest.approx((2 - 1 + 1.5 - 2) / 4)
  np.testing.assert_allclose(adv, [[0, 0.125 - 2, 0.125 + 1, 0], [0, 0, 0.125 - 1.5, 0.125 + 2]], atol=1e-6)
  adv2 = token_advantages(batch, student, [t1, t2], [0.5, 0.5], reward_weight=2.0)[0]["advantages"]
  np.testing.assert_allclose(adv2 - adv, [[0, 2, 2, 0], [0, 0, -2, -2]], atol=1e-6)
  # without the step's prev logprobs (one minibatch), the student scores the batch itself
  del batch.extras["prev_logprobs"]
  again, _ = token_advantages(batch, student, [t1, t2], [0.5, 0.5], reward_weight=0.0)
  np.testing.assert_allclose(again["advantages"], adv, atol=1e-6)
  with pytest.raises(ValueError, match="teachers"):
    distill_update([t1], [0.5, 0.5], 0.0)


def _run_with_a_digit_teacher(tokenizer, tmp_path, lr: float, make_update) -> list[dict]:
  """12 loop steps of a bigram student at Adam rate `lr` under `make_update(teacher)`, the teacher
  a bigram that starts its replies with digits (which the env's reward, never seen by the update,
  pays for); the per-step metric rows."""
  config = math_config("configs/distill.py", **{"grpo.max_num_steps": 12, "optim.lr": lr,
                                                "grpo.num_prompts_per_step": 4,
                                                "grpo.num_generations_per_prompt": 8})
  env = FirstDigitEnv(MathConfig.from_config(config))
  policy, gen, sync = _parts(tokenizer)
  policy.base_lr = lr
  policy.set_lr(None)
  teacher = BigramPolicy(len(tokenizer), seed=1)
  digits = [i for i in range(len(tokenizer)) if tokenizer.decode([i]).strip()[:1].isdigit()]
  teacher.table = teacher.table.at[:, digits].add(4.0)   # the teacher starts its replies with digits
  workdir = str(tmp_path / "run")
  run_grpo(config, policy=policy, generator=gen, synchronizer=sync, env=env, tokenizer=tokenizer,
           train_tasks=env.train, val_tasks=env.validation, workdir=workdir, progress=False,
           update=make_update(teacher))
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  return [r for r in rows if "reward/raw_mean" in r]


def _first_last(steps: list[dict], key: str) -> tuple[float, float]:
  """The mean of `key` over the first 3 and the last 3 steps."""
  return tuple(float(np.mean([r[key] for r in part])) for part in (steps[:3], steps[-3:]))


def test_the_loop_with_the_distill_objective_pulls_the_student_to_the_teacher(tokenizer, tmp_path):
  steps = _run_with_a_digit_teacher(
      tokenizer, tmp_path, 0.5,
      lambda teacher: distill_update([teacher], [1.0], reward_weight=0.0, loss="sampled_token"))
  assert len(steps) == 12 and all(r["train/sequences"] == 32 for r in steps)   # flat groups train too
  first, last = _first_last(steps, "reward/raw_mean")
  kl_first, kl_last = _first_last(steps, "distill/reverse_kl")
  assert last > first + 0.3, (first, last)
  assert kl_last < kl_first - 0.5, (kl_first, kl_last)


def test_the_loop_with_the_topk_kl_pulls_the_student_to_the_teacher(tokenizer, tmp_path):
  """The same run with the top-k KL (the default loss): the teachers' top 4 per position, at Adam
  0.1 (a dense loss on every visited row: at 0.5 it oscillates, KL 0.12 -> 0.24)."""
  from dockyard.trainer_jax.loss import make_topk_kl_loss
  steps = _run_with_a_digit_teacher(
      tokenizer, tmp_path, 0.1,
      lambda teacher: distill_update([teacher], [1.0], reward_weight=0.0, loss="topk_kl", top_k=4,
                                     topk_loss=make_topk_kl_loss([1.0])))
  assert len(steps) == 12
  first, last = _first_last(steps, "reward/raw_mean")
  kl_first, kl_last = _first_last(steps, "train/topk_kl")
  mass_first, mass_last = _first_last(steps, "train/topk_student_mass")
  print(f"reward {first:.2f} -> {last:.2f}, top-k KL {kl_first:.3f} -> {kl_last:.3f}, "
        f"student mass on the teacher's top 4 {mass_first:.3f} -> {mass_last:.3f}")
  # measured: reward 0.11 -> 0.38, KL 0.141 -> 0.030, mass 0.018 -> 0.161
  assert last > first + 0.2, (first, last)
  assert kl_last < kl_first / 2, (kl_first, kl_last)
  assert mass_last > mass_first + 0.1, (mass_first, mass_last)


@pytest.mark.parametrize("override,key", [
    ({"grpo.distill.teachers": ()}, "grpo.distill.teachers"),
    ({"grpo.distill.teachers": ("/no/such/dir",)}, "grpo.distill.teachers"),
    ({"grpo.distill.weights": (0.5,)}, "grpo.distill.weights"),
    ({"grpo.distill.reward_weight": -1.0}, "grpo.distill.reward_weight"),
    ({"grpo.dynamic_sampling": True}, "grpo.dynamic_sampling"),
    ({"grpo.objective": "policy_gradient"}, "grpo.distill"),
    ({"grpo.distill.loss": "forward_kl"}, "grpo.distill.loss"),
    ({"grpo.distill.top_k": 0}, "grpo.distill.top_k"),
    ({"loss_fn.reference_policy_kl_penalty": 0.01}, "loss_fn.reference_policy_kl_penalty"),
    ({"policy.packing_row_tokens": 512}, "policy.packing_row_tokens"),
])
def test_bad_distill_settings_are_named(override, key):
  config = with_overrides("configs/distill.py", override)
  with pytest.raises(validate.ConfigError, match=key.replace(".", r"\.")):
    validate.validate(config)
