"""`supervised.loop.sft_train` in process with the GRPO tests' fakes (a JAX bigram policy and a
generator sampling from its table), so the loop's logic runs in seconds: metrics rows by step,
held-out loss falling, the generation metric refitting the generator before it samples, and a
second call into the workdir resuming from checkpoints/latest. The real trainers and engine run in
tests/integration/test_sft_runs.py."""
import json
import os

import numpy as np
import pytest

from configs import sft as sft_config
from dockyard.envs import math as math_env
from dockyard.refit.synchronizer import WeightSynchronizer
from dockyard.refit.transports import InProcessTransport
from dockyard.rollout.base import SamplingParams
from dockyard.supervised import data, loop
from dockyard.trainer_jax import loss as jax_loss
from tests.grpo.grpo_fakes import BigramGenerator, BigramPolicy


def small_config(**sft):
  config = sft_config.get_config()
  config.sft.update({**dict(num_steps=6, batch_size=8, val_period=3, generate_period=6), **sft})
  config.checkpoint.save_period = 3
  config.logging.tensorboard, config.logging.png_curve = False, False
  return config


def rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


def test_loop_validates_generates_checkpoints_and_resumes(tiny_tokenizer, tmp_path):
  tok, workdir = tiny_tokenizer, str(tmp_path)
  env = math_env.MathEnv(math_env.MathConfig(num_train=40, num_validation=10))
  train, val = data.gold_conversations(env, env.train), data.gold_conversations(env, env.validation)
  policy = BigramPolicy(len(tok), lr=0.05)
  generator = BigramGenerator(np.zeros((len(tok), len(tok))), tok.eos_token_id)
  metric = loop.GenerationMetric(WeightSynchronizer(policy, generator, InProcessTransport(generator)),
                                 generator, env, tok, env.validation, SamplingParams(temperature=0.0, max_tokens=4))
  result = loop.sft_train(small_config(), policy=policy, tokenizer=tok, train=train, validation=val,
                          workdir=workdir, loss_fn=jax_loss.nll_loss, generation=metric, progress=False)
  metric.close()
  got = rows(workdir)
  assert [r["step"] for r in got] == list(range(7))
  assert [r["step"] for r in got if "val/loss" in r] == [0, 3, 6]
  assert [r["step"] for r in got if "val/pass@1" in r] == [0, 6]
  assert [r["step"] for r in got if "time/checkpoint" in r] == [3, 6]
  assert got[-1]["val/loss"] < got[3]["val/loss"] < got[0]["val/loss"]
  assert got[0]["val/tokens"] == sum(sum(e.mask) for e in data.encode_conversations(tok, val, 128))
  # The generator sampled with the trained weights: refit pushed version 2 (steps 0 and 6) = the table.
  assert generator.weight_version == 2 and np.array_equal(generator.table, np.asarray(policy.table))
  assert generator.requests == [(10, 1, 0.0, None)] * 2   # one greedy sample of each held-out task, twice
  assert result.resumed_from is None and result.steps == 6

  resumed = BigramPolicy(len(tok), lr=0.05, seed=1)
  result = loop.sft_train(small_config(num_steps=8, generate_period=0), policy=resumed, tokenizer=tok,
                          train=train, validation=val, workdir=workdir, loss_fn=jax_loss.nll_loss, progress=False)
  assert result.resumed_from == 6 and resumed.step == 8
  got = rows(workdir)
  assert [r["step"] for r in got] == list(range(9))   # 7 and 8 appended, no second step 0
  assert got[-1]["val/loss"] < got[6]["val/loss"]


def test_loop_refuses_conversations_too_long(tiny_tokenizer, tmp_path):
  conv = data.Conversation(({"role": "user", "content": "Hi " * 200}, {"role": "assistant", "content": "Hello."}))
  with pytest.raises(ValueError, match="policy.max_seq_len=128"):
    loop.sft_train(small_config(), policy=BigramPolicy(len(tiny_tokenizer)), tokenizer=tiny_tokenizer,
                   train=[conv], validation=[], workdir=str(tmp_path), loss_fn=jax_loss.nll_loss, progress=False)
