"""Pairs from the model's own samples (`dockyard/dpo/sampled.py`) around a scripted engine and the
real math env: a right answer over a wrong one, only from questions with both, at most
`pairs_per_prompt` each, no text twice on a side; and the config's checks. The real engine runs
in the SmolLM2 measurements (docs/dpo.md)."""
import random

import pytest
import transformers

from dockyard import validate
from dockyard.dpo.sampled import SampledPairsConfig, make_pairs, pair_up
from dockyard.envs.math import MathConfig, MathEnv
from dockyard.models import tiny
from dockyard.rollout.base import Completion
from tests.config_overrides import with_overrides


class Scripted:
  """Per prompt, n replies from a script keyed by the prompt's index."""
  def __init__(self, tokenizer, replies):
    self.tok, self.replies, self.calls = tokenizer, replies, []

  def generate(self, prompt_ids, n, sampling):
    self.calls.append((len(prompt_ids), n, sampling))
    out = []
    for i, _ in enumerate(prompt_ids):
      group = []
      for text in self.replies[i][:n]:
        ids = self.tok.encode(text, add_special_tokens=False)
        group.append(Completion(prompt_ids=[], token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop",
                                weight_version=0))
      out.append(group)
    return out


def test_a_right_sample_over_a_wrong_one_from_questions_with_both():
  tok = transformers.AutoTokenizer.from_pretrained(tiny.make_tiny_model())
  env = MathEnv(MathConfig(num_train=4, num_validation=0))
  tasks = env.train[:4]
  right = [str(t["answer"]) for t in tasks]
  wrong = [str(t["answer"] + 1) for t in tasks]
  replies = [
      [right[0], wrong[0], right[0], f"{wrong[0]} or so"],   # two distinct wrong, one distinct right
      [right[1]] * 4,                                        # all right: no pair
      [wrong[2], "no number here", wrong[2], wrong[2]],      # all wrong (one malformed): no pair
      [right[3], f"= {right[3]}", wrong[3], f"{wrong[3]}!"],  # two and two: capped at pairs_per_prompt
  ]
  cfg = SampledPairsConfig(num_samples=4, temperature=1.0, num_train_prompts=4, num_val_prompts=0,
                           pairs_per_prompt=2)
  engine = Scripted(tok, replies)
  pairs, records = make_pairs(engine, tok, env, tasks, cfg, max_new_tokens=8, seed=0)
  (n, k, sampling), = engine.calls
  assert (n, k, sampling.temperature, sampling.max_tokens) == (4, 4, 1.0, 8)
  assert [len(r["pairs"]) for r in records] == [1, 0, 0, 2]
  assert [r["rewards"] for r in records][0] == [1.0, 0.0, 1.0, 0.0]
  for p in pairs:
    assert env.is_success(_score(env, tasks, p.messages, p.chosen))
    assert not env.is_success(_score(env, tasks, p.messages, p.rejected))
  assert pairs[0].messages == tuple(env.prompt_messages(tasks[0]))
  last = [(p.chosen, p.rejected) for p in pairs[1:]]
  assert len({c for c, _ in last}) == 2 and len({r for _, r in last}) == 2   # no text twice on a side
  again, _ = make_pairs(Scripted(tok, replies), tok, env, tasks, cfg, max_new_tokens=8, seed=0)
  assert again == pairs                                                        # seeded


def _score(env, tasks, messages, text):
  import asyncio
  task = next(t for t in tasks if tuple(env.prompt_messages(t)) == messages)
  return asyncio.run(env.score(task, text))


def test_pair_up_caps_and_uses_each_text_once():
  made = pair_up(["a", "b", "a"], ["x"], 3, random.Random(0))
  assert len(made) == 1 and made[0][1] == "x"
  assert pair_up([], ["x", "y"], 2, random.Random(0)) == []
  assert len(pair_up(["a", "b", "c"], ["x", "y", "z"], 2, random.Random(1))) == 2


@pytest.mark.parametrize("override,key", [
    ({"sampled_pairs.num_samples": 1}, "sampled_pairs.num_samples"),
    ({"sampled_pairs.temperature": 0.0}, "sampled_pairs.temperature"),
    ({"sampled_pairs.pairs_per_prompt": 0}, "sampled_pairs.pairs_per_prompt"),
    ({"data.train": "pairs.jsonl"}, "data.train"),
    ({"dpo.generate_period": -1}, "dpo.generate_period"),
    ({"rollout.max_new_tokens": 256}, "rollout.max_new_tokens"),
    ({"policy.max_seq_len": 64}, "policy.max_seq_len"),
])
def test_bad_sampled_pair_settings_are_named(override, key):
  config = with_overrides("configs/dpo.py:smollm", override)
  with pytest.raises(validate.ConfigError, match=key.replace(".", r"\.")):
    validate.validate(config)


def test_rlaif_and_sampled_pairs_together_are_refused():
  config = with_overrides("configs/rlaif.py", {})
  config.sampled_pairs = with_overrides("configs/dpo.py:smollm", {}).sampled_pairs
  with pytest.raises(validate.ConfigError, match="sampled_pairs"):
    validate.validate(config)


def test_the_shipped_configs_validate():
  for spec in ("configs/dpo.py", "configs/dpo.py:smollm", "configs/rlaif.py", "configs/rlaif.py:smollm"):
    validate.validate(with_overrides(spec, {}))
