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
  with pytest.raises(ValueError, match="env.math.answer_extraction"):
    MathConfig(answer_extraction="first_integer")


def test_instruction_joins_the_question_in_the_user_turn():
  env = MathEnv(MathConfig(num_train=3, num_validation=0, instruction="Answer with the number only."))
  task = env.train[0]
  assert env.prompt_messages(task) == [{"role": "user", "content": f"{task['question']} Answer with the number only."}]


def test_one_final_answer_is_read_so_listing_candidates_does_not_pay():
  env = MathEnv(MathConfig(num_train=3, num_validation=0))
  task = dict(env.train[0], answer=42)

  def score(text, e=env):
    return asyncio.run(e.score(task, text))
  assert score("17 + 25 = 42.").value == 1.0 and env.is_success(score("17 + 25 = 42."))
  # The right number among others but not last: wrong. Every candidate listed: only the last counts.
  assert score("42? No: 17 + 25 = 41").value == 0.0
  assert score(" ".join(str(i) for i in range(200))).value == 0.0
  assert score(" ".join(str(i) for i in range(200)) + " 42").value == 1.0   # a single final 42
  tagged = MathEnv(MathConfig(num_train=3, num_validation=0, answer_extraction="answer_tag"))
  assert parse_answer("17 + 25 = 42", "answer_tag") is None
  assert parse_answer("Answer: 41. Oops, answer: -42 (17 + 25)", "answer_tag") == -42
  assert score("17 + 25 = 42", tagged).malformed and score("17 + 25 = 42", tagged).value == 0.0
  assert score("17 + 25 = 41\nAnswer: 42", tagged).value == 1.0
  gold = tagged.gold_completion(task)
  assert gold == "Answer: 42" and score(gold, tagged).value == 1.0
  assert not env.is_success(score("no idea"))
