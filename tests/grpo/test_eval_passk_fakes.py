"""`dockyard.eval.evaluate` on the fakes (a bigram policy's sampler, a reward it sometimes earns):
the greedy pass@1, the sampled pass@1 / pass@k and their intervals are those of the completions it
wrote, computed with the unbiased estimator; the requests are greedy n=1 then n samples at T."""
import collections
import json
import os

import numpy as np
import pytest

from dockyard import estimators
from dockyard import eval as eval_lib
from dockyard.envs.math import MathConfig

from grpo_fakes import BigramGenerator, BigramPolicy, FirstDigitEnv, math_config


def test_evaluate_reports_pass_at_k_of_its_samples(tokenizer, tmp_path):
  config = math_config(**{"env.math.num_validation": 20, "eval.pass_k": 4, "eval.num_samples": 8})
  env = FirstDigitEnv(MathConfig.from_config(config))
  gen = BigramGenerator(np.asarray(BigramPolicy(len(tokenizer), seed=0).table), tokenizer.eos_token_id)
  report = eval_lib.evaluate(config, generator=gen, env=env, tokenizer=tokenizer, tasks=env.validation,
                             workdir=str(tmp_path))
  # Greedy and seeded; then unseeded samples (a request seed would be shared by all 20 tasks).
  assert gen.requests == [(20, 1, 0.0, config.run.seed), (20, 8, 1.0, None)]
  assert json.load(open(tmp_path / "eval.json")) == json.loads(json.dumps(report))
  rows = [json.loads(line) for line in open(tmp_path / eval_lib.SAMPLES)]
  greedy = [r for r in rows if r["kind"] == "val_T0"]
  wins = sum(r["success"] for r in greedy)
  assert report["n"] == len(greedy) == 20
  assert report["pass@1"] == wins / 20 and report["pass@1_ci95"] == pytest.approx(list(estimators.wilson_interval(wins, 20)))
  per_task = collections.Counter()
  for r in rows:
    if r["kind"] == "sample_T1":
      per_task[r["instance_id"]] += r["success"]
  counts = [(8, c) for c in per_task.values()]
  assert len(counts) == 20 and 0 < sum(c for _, c in counts) < 160, counts   # mixed: the checks bite
  s = report["sampled"]
  for k in (1, 4):
    values = estimators.pass_at_k_per_problem(counts, k)
    assert s[f"pass@{k}"] == pytest.approx(values.mean())
    assert s[f"pass@{k}_ci95"] == pytest.approx(list(estimators.bootstrap_ci(values, 1000, config.run.seed)))
  assert s["pass@1"] == pytest.approx(sum(c for _, c in counts) / 160)
  assert s["pass@1"] < s["pass@4"] and s["tasks_with_a_success"] == sum(c > 0 for _, c in counts)


def test_evaluate_without_pass_k_only_samples_greedily(tokenizer, tmp_path):
  config = math_config(**{"env.math.num_validation": 5, "eval.pass_k": 0})
  env = FirstDigitEnv(MathConfig.from_config(config))
  gen = BigramGenerator(np.asarray(BigramPolicy(len(tokenizer), seed=0).table), tokenizer.eos_token_id)
  report = eval_lib.evaluate(config, generator=gen, env=env, tokenizer=tokenizer, tasks=env.validation,
                             workdir=str(tmp_path))
  assert len(gen.requests) == 1 and "sampled" not in report
  with pytest.raises(ValueError, match="no tasks"):
    eval_lib.evaluate(config, generator=gen, env=env, tokenizer=tokenizer, tasks=[], workdir=str(tmp_path))
