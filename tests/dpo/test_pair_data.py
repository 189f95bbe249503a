"""The preference pairs (`dockyard.dpo.data`): the TRL-schema JSONL reader (a bad record names its
line), the math pairs (deterministic, rejected always wrong), the interleaved batch layout the loss
spec reads, and the step sampler."""
import json

import numpy as np
import pytest

from dockyard.dpo import data
from dockyard.envs import math as math_env


def write(tmp_path, lines):
  path = tmp_path / "pairs.jsonl"
  path.write_text("\n".join(l if isinstance(l, str) else json.dumps(l) for l in lines) + "\n")
  return str(path)


def test_jsonl_reads_string_and_chat_prompts(tmp_path):
  path = write(tmp_path, [
      {"prompt": "What is 2 + 2?", "chosen": "4", "rejected": "5"},
      "",
      {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
       "chosen": [{"role": "assistant", "content": "Hello."}], "rejected": "Go away."},
  ])
  pairs = data.read_jsonl(path)
  assert len(pairs) == 2
  assert pairs[0].messages == ({"role": "user", "content": "What is 2 + 2?"},)
  assert (pairs[0].chosen, pairs[0].rejected) == ("4", "5")
  assert [m["role"] for m in pairs[1].messages] == ["system", "user"]
  assert pairs[1].chosen == "Hello."


@pytest.mark.parametrize("bad, words", [
    ('{"prompt": "q", "chosen": "a"', "not valid JSON"),
    ('["q", "a", "b"]', "expected a JSON object"),
    ({"prompt": "q", "chosen": "a"}, "missing ['rejected']"),
    ({"prompt": "q", "chosen": "", "rejected": "b"}, "'chosen' must be a non-empty string"),
    ({"prompt": "q", "chosen": "a", "rejected": 3}, "'rejected' must be a non-empty string"),
    ({"prompt": "", "chosen": "a", "rejected": "b"}, "'prompt' must be a non-empty string"),
    ({"prompt": [{"role": "user"}], "chosen": "a", "rejected": "b"}, "prompt message 0"),
    ({"prompt": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
      "chosen": "a", "rejected": "b"}, "ends with an assistant message"),
    ({"prompt": "q", "chosen": "a", "rejected": "a"}, "the same text"),
])
def test_a_bad_record_names_its_line(tmp_path, bad, words):
  path = write(tmp_path, [{"prompt": "ok", "chosen": "1", "rejected": "2"}, "", bad])
  with pytest.raises(data.PairDataError) as err:
    data.read_jsonl(path)
  assert str(err.value).startswith(f"{path}:3: "), err.value
  assert words in str(err.value)


def test_an_empty_file_is_an_error(tmp_path):
  with pytest.raises(data.PairDataError, match="no preference pairs"):
    data.read_jsonl(write(tmp_path, [""]))


def test_math_pairs_are_deterministic_and_the_rejected_answer_is_wrong():
  env = math_env.MathEnv(math_env.MathConfig())
  pairs = data.math_pairs(env, env.train, seed=0)
  assert pairs == data.math_pairs(env, env.train, seed=0)
  assert pairs != data.math_pairs(env, env.train, seed=1)
  assert len(pairs) == len(env.train)
  for task, pair in zip(env.train, pairs):
    assert pair.messages == tuple(env.prompt_messages(task))
    assert pair.chosen == str(task["answer"])
    assert 1 <= abs(int(pair.rejected) - task["answer"]) <= data.MAX_OFFSET
  offsets = {int(p.rejected) - t["answer"] for t, p in zip(env.train, pairs)}
  assert min(offsets) < 0 < max(offsets)   # both directions, so "bigger" is no shortcut


class Tok:
  """A character tokenizer with a chat template's shape: enough for the batch layout."""
  eos_token_id, pad_token_id, chat_template = 1, 0, "yes"

  def apply_chat_template(self, messages, tokenize, add_generation_prompt, return_dict):
    return [2] + [3 + ord(c) % 50 for m in messages for c in m["content"]] + [2]

  def encode(self, text, add_special_tokens=False):
    return [3 + ord(c) % 50 for c in text]


def test_pairs_are_interleaved_right_padded_and_masked_on_completions():
  pairs = [data.PreferencePair(({"role": "user", "content": "ab"},), "c", "dde"),
           data.PreferencePair(({"role": "user", "content": "abcd"},), "xy", "z")]
  enc = data.encode_pairs(Tok(), pairs, max_seq_len=64)
  batch = data.make_pair_batch(enc, pad_id=0, pad_multiple=8)
  assert batch.input_ids.shape == (4, 16)   # the longest row, 9 tokens, rounded up to 8s
  prompt0, prompt1 = len(enc[0].prompt), len(enc[1].prompt)
  # row 2i chosen, 2i+1 rejected, each completion + EOS in the loss mask, nothing else
  assert batch.loss_mask.sum(1).tolist() == [2, 4, 3, 2]
  assert batch.loss_mask[0, :prompt0].sum() == 0 and batch.loss_mask[2, :prompt1].sum() == 0
  assert batch.input_ids[1, prompt0 + 3] == Tok.eos_token_id
  assert (batch.attention_mask[:, 1:] <= batch.attention_mask[:, :-1]).all()   # right padding
  with pytest.raises(ValueError, match="pair 1: 9 tokens"):
    data.encode_pairs(Tok(), pairs, max_seq_len=8)


def test_sampler_covers_each_epoch_and_depends_on_the_step_only():
  s = data.PairSampler(10, 4, seed=3)
  first_epoch = s.indices(1) + s.indices(2) + s.indices(3)[:2]
  assert sorted(first_epoch) == list(range(10))
  assert data.PairSampler(10, 4, seed=3).indices(7) == s.indices(7)
  assert s.indices(1) != data.PairSampler(10, 4, seed=4).indices(1)
