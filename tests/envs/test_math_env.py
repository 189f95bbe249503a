"""The arithmetic environment: deterministic data, disjoint splits, parsing, rewards, bad config."""
import asyncio

import pytest

from dockyard.envs.base import Environment
from dockyard.envs.math import MathConfig, MathEnv, make_dataset, parse_answer


def test_dataset_is_deterministic_and_splits_are_disjoint():
  cfg = MathConfig(seed=3, ops=("+", "*"), min_operand=0, max_operand=9, num_train=150, num_validation=40)
  train, val = make_dataset(cfg)
  assert (train, val) == make_dataset(cfg)
  assert len(train) == 150 and len(val) == 40
  questions = [t["question"] for t in train + val]
  assert len(set(questions)) == 190
  assert make_dataset(MathConfig(seed=4, ops=("+", "*"), num_train=150, num_validation=40))[0] != train
  for t in train + val:
    a, op, b = t["question"][len("What is "):-1].split()
    assert t["answer"] == (int(a) + int(b) if op == "+" else int(a) * int(b))
  big = MathConfig(min_operand=10, max_operand=99_999, num_train=50, num_validation=10)
  assert len({t["question"] for t in sum(make_dataset(big), [])}) == 60


def test_parse_last_integer():
  assert parse_answer("85") == 85
  assert parse_answer("37 + 48 = 85") == 85
  assert parse_answer("it is -3.") == -3
  assert parse_answer("no idea") is None


def test_score_and_validation_metrics():
  env = MathEnv(MathConfig(num_train=5, num_validation=5))
  assert isinstance(env, Environment)
  task = env.train[0]
  assert env.prompt_messages(task) == [{"role": "user", "content": task["question"]}]

  async def run():
    return await asyncio.gather(env.score(task, env.gold_completion(task)),
                                env.score(task, str(task["answer"] + 1)),
                                env.score(task, "hmm"))
  right, wrong, bad = asyncio.run(run())
  assert (right.value, wrong.value, bad.value) == (1.0, 0.0, 0.0)
  assert (right.malformed, wrong.malformed, bad.malformed) == (False, False, True)
  assert right.components == {"correct": 1.0, "format": 1.0}
  assert env.validation_metrics([right, wrong, bad]) == pytest.approx(
      {"accuracy": 1 / 3, "malformed_fraction": 1 / 3})
  sys_env = MathEnv(MathConfig(num_train=2, num_validation=0, system_prompt="Answer with a number."))
  assert sys_env.prompt_messages(task)[0]["role"] == "system"


def test_equation_gold_format_restates_the_operands_and_scores_right():
  env = MathEnv(MathConfig(num_train=5, num_validation=0, gold_format="equation"))
  task = env.train[0]
  gold = env.gold_completion(task)
  assert gold == f"{task['question'][len('What is '):-1]} = {task['answer']}"
  assert asyncio.run(env.score(task, gold)).value == 1.0
  assert MathEnv(MathConfig(num_train=5, num_validation=0)).gold_completion(task) == str(task["answer"])


def test_bad_config_is_named():
  with pytest.raises(ValueError, match="env.math.ops"):
    MathConfig(ops=("^",))
  with pytest.raises(ValueError, match="exceeds the 100 distinct"):
    MathConfig(num_train=90, num_validation=20)
  with pytest.raises(ValueError, match="env.math.gold_format"):
    MathConfig(gold_format="prose")
  with pytest.raises(ValueError, match="min_operand"):
    MathConfig(min_operand=5, max_operand=1)
