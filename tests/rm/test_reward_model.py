"""The `RewardModel` seam on both backends (tiny model): the score is read at the last real token
(padding and the tokens after it change nothing), JAX and torch agree on the same weights and on a
training step, either loads the other's saved directory (the HF *ForSequenceClassification
layout), transformers' own class loads it too; the pair data (margins, the words pairs); the
reward-model environment (batched scoring, the wrapped env's verdict kept)."""
import asyncio
import json
import os

import ml_collections
import numpy as np
import pytest
import transformers
from safetensors.numpy import load_file

from dockyard.dpo.data import PairDataError
from dockyard.envs import math as math_env
from dockyard.envs.reward_model import RewardModelEnv
from dockyard.grpo.batch import pack_sequences
from dockyard.models import tiny
from dockyard.rm import data as rm_data
from dockyard.rm.model import SCORE_WEIGHT
from dockyard.trainer_jax.reward_loss import reward_loss as jax_loss
from dockyard.trainer_jax.reward_model import JaxRewardModel
from dockyard.trainer_torch.reward_loss import reward_loss as torch_loss
from dockyard.trainer_torch.reward_model import TorchRewardModel

CFG = ml_collections.ConfigDict(dict(run=dict(seed=0), optim=dict(lr=1e-3, weight_decay=0.01, max_grad_norm=1.0)))


@pytest.fixture(scope="module")
def lm_path():
  return tiny.make_tiny_model()


@pytest.fixture(scope="module")
def saved(lm_path, tmp_path_factory):
  """A JAX reward model (fresh seeded head) saved, and the torch one loaded from that directory."""
  path = str(tmp_path_factory.mktemp("rm") / "jax_rm")
  jax_rm = JaxRewardModel.from_hf(lm_path, CFG)
  jax_rm.save_hf(path)
  return path, jax_rm, TorchRewardModel.from_hf(path, CFG)


def batch(pad_id=0, pad_multiple=16):
  # two pairs; rows of different lengths, right-padded
  return pack_sequences([[5, 6, 7], [5, 6, 7], [9, 9], [9, 9]], [[10, 11, 2], [12, 2], [3, 2], [4, 5, 6, 2]],
                        pad_id, pad_multiple)


def test_the_score_is_read_at_the_last_real_token(saved):
  _, jax_rm, torch_rm = saved
  b = batch()
  for model in (jax_rm, torch_rm):
    r = model.rewards(b)
    assert r.shape == (4,) and r.dtype == np.float32 and len(set(r.tolist())) == 4
    # Padding: more of it, or other ids in it, change nothing.
    wider = batch(pad_multiple=32)
    np.testing.assert_allclose(model.rewards(wider), r, rtol=1e-5, atol=1e-6)
    junk = batch()
    junk.input_ids = np.where(junk.attention_mask == 1, junk.input_ids, 77).astype(np.int32)
    np.testing.assert_allclose(model.rewards(junk), r, rtol=1e-5, atol=1e-6)
    # The last real token matters.
    last = junk.attention_mask.sum(-1) - 1
    changed = batch()
    changed.input_ids[0, last[0]] = 8
    assert abs(model.rewards(changed)[0] - r[0]) > 1e-6 and np.allclose(model.rewards(changed)[1:], r[1:], atol=1e-6)
  left = batch()
  left.attention_mask = left.attention_mask[:, ::-1].copy()
  with pytest.raises(ValueError, match="not right-padded"):
    jax_rm.rewards(left)


def test_backends_agree_and_load_each_others_directories(saved, lm_path, tmp_path):
  path, jax_rm, torch_rm = saved
  b = batch()
  np.testing.assert_allclose(torch_rm.rewards(b), jax_rm.rewards(b), rtol=1e-4, atol=1e-5)
  tensors = load_file(os.path.join(path, "model.safetensors"))
  with open(os.path.join(path, "config.json")) as f:
    hf = json.load(f)
  assert hf["architectures"] == ["Qwen2ForSequenceClassification"] and hf["id2label"] == {"0": "LABEL_0"}
  assert tensors[SCORE_WEIGHT].shape == (1, hf["hidden_size"]) and "lm_head.weight" not in tensors
  assert os.path.exists(os.path.join(path, "tokenizer.json"))
  # transformers' class loads it; with no pad token inside the rows its own pooling (the rightmost
  # non-pad token) is the last real token, so its logits are our rewards.
  hf_model = transformers.AutoModelForSequenceClassification.from_pretrained(path)
  import torch
  with torch.no_grad():
    logits = hf_model(input_ids=torch.as_tensor(b.input_ids, dtype=torch.long),
                      attention_mask=torch.as_tensor(b.attention_mask, dtype=torch.long)).logits[:, 0].numpy()
  np.testing.assert_allclose(logits, jax_rm.rewards(b), rtol=1e-4, atol=1e-5)
  # One step on each backend: the same loss and gradient norm; then torch's save into JAX.
  b.extras["margin"] = np.array([0.5, 0.0], np.float32)
  mj = jax_rm.train_step(b, jax_loss)
  mt = torch_rm.train_step(b, torch_loss)
  for k in ("loss", "accuracy", "reward_margin", "grad_norm"):
    assert mj[k] == pytest.approx(mt[k], rel=1e-4, abs=1e-6), k
  np.testing.assert_allclose(torch_rm.rewards(b), jax_rm.rewards(b), rtol=1e-3, atol=1e-4)
  torch_rm.save_hf(str(tmp_path / "torch_rm"))
  back = JaxRewardModel.from_hf(str(tmp_path / "torch_rm"), CFG, trainable=False)
  np.testing.assert_allclose(back.rewards(b), torch_rm.rewards(b), rtol=1e-4, atol=1e-5)
  with pytest.raises(RuntimeError, match="scoring"):
    back.train_step(b, jax_loss)


def test_jsonl_margins_and_the_words_pairs(tmp_path):
  path = tmp_path / "pairs.jsonl"
  path.write_text(json.dumps({"prompt": "q", "chosen": "a", "rejected": "b", "margin": 1.5}) + "\n"
                  + json.dumps({"prompt": "q", "chosen": "a", "rejected": "c"}) + "\n")
  assert [p.margin for p in rm_data.read_jsonl(str(path))] == [1.5, 0.0]
  path.write_text(json.dumps({"prompt": "q", "chosen": "a", "rejected": "b", "margin": "big"}) + "\n")
  with pytest.raises(PairDataError, match=r"pairs.jsonl:1: 'margin' must be a finite number"):
    rm_data.read_jsonl(str(path))
  assert [rm_data.in_words(n) for n in (0, 7, 13, 40, 42, -5, 105, 9801)] == [
      "zero", "seven", "thirteen", "forty", "forty-two", "minus five", "one hundred five",
      "nine thousand eight hundred one"]
  env = math_env.MathEnv(math_env.MathConfig())
  pairs = rm_data.math_pairs(env, env.validation)
  assert len(pairs) == len(env.validation)
  for p, task in zip(pairs, env.validation):
    assert p.pair.chosen == str(task["answer"]) and p.pair.rejected == rm_data.in_words(task["answer"])
    assert asyncio.run(env.score(task, p.pair.rejected)).malformed   # the env cannot read it


def test_reward_model_env_batches_and_keeps_the_env_verdict(saved, lm_path):
  _, jax_rm, _ = saved
  tokenizer = transformers.AutoTokenizer.from_pretrained(lm_path)
  base = math_env.MathEnv(math_env.MathConfig())
  env = RewardModelEnv(base, jax_rm, tokenizer, max_seq_len=128, batch_size=4)
  tasks = base.validation[:3]
  texts = [str(t["answer"]) for t in tasks] + [str(t["answer"] + 1) for t in tasks]

  async def score_all():
    return await asyncio.gather(*[env.score(t, x) for t, x in zip(tasks + tasks, texts)])
  rewards = asyncio.run(score_all())
  assert env.batches_scored == 2                       # 6 scorings gathered: batches of 4 and 2
  assert [env.is_success(r) for r in rewards] == [True] * 3 + [False] * 3
  # Each value is the model's score of prompt + completion + EOS, as rm_train packs a pair row.
  enc = rm_data.encode(tokenizer, [rm_data.MarginPair(rm_data.pair_data.PreferencePair(
      tuple(base.prompt_messages(tasks[0])), texts[0], texts[3]))], 128)
  want = jax_rm.rewards(rm_data.make_batch(enc, tokenizer.pad_token_id))
  assert rewards[0].value == pytest.approx(float(want[0]), rel=1e-5)
  assert rewards[3].value == pytest.approx(float(want[1]), rel=1e-5)
  m = env.validation_metrics(rewards)
  assert m["accuracy"] == pytest.approx(0.5) and m["env_reward"] == pytest.approx(0.5)
  assert m["reward_model"] == pytest.approx(np.mean([r.value for r in rewards]))
  assert env.gold_completion(tasks[0]) == base.gold_completion(tasks[0])
