"""SWE GRPO end to end with real parts, shortened: SFT on two tasks' gold patches, then two sync GRPO
steps whose rewards come from the sandbox running the held-out tests.

Checks the two things the default run depends on: the reward pipeline yields groups whose rewards
differ (something to learn from), and a GRPO training step changes the weights vLLM serves (vLLM's
prompt logprobs of a probe move, and after the refit they equal the trainer's).
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from dockyard import policy_factory
from dockyard.rollout.chat import encode_prompt
from dockyard.grpo.loop import grpo_train
from dockyard.grpo.sft import sft_warmup
from dockyard.grpo.source import SyncSource
from dockyard.grpo.step import refit
from dockyard.policy import TrainBatch
from tests.integration.swe_parts import parts  # noqa: F401 — the session fixture

SFT_STEPS = 60   # two tasks, batch 2: well-formed patches (40 steps on four tasks: all malformed)


def _probe(parts, task) -> list[int]:
  tok = parts.tokenizer
  return (encode_prompt(tok, parts.env.prompt_messages(task))
          + tok.encode(parts.env.gold_completion(task), add_special_tokens=False))


def _engine_logprobs(parts, ids) -> np.ndarray:
  return np.asarray(parts.generator.prompt_logprobs([ids])[0], np.float64)[1:]


def _trainer_logprobs(parts, ids) -> np.ndarray:
  a = np.asarray([ids], np.int32)
  ones = np.ones_like(a)
  return np.asarray(parts.policy.logprobs(TrainBatch(a, ones, ones)), np.float64)[0, 1:]


@pytest.mark.slow
def test_sft_then_grpo_on_sandbox_rewards(parts, tmp_path):
  tasks = parts.train_tasks[:2]
  config = parts.config
  pg_loss, nll = policy_factory.make_losses(config)
  history = sft_warmup(parts.policy, parts.env, parts.tokenizer, tasks, steps=SFT_STEPS, batch_size=2,
                       lr=3e-3, loss_fn=nll, pad_multiple=16)
  assert history[-1]["loss"] < history[0]["loss"]
  refit(parts.synchronizer)
  probe = _probe(parts, tasks[0])
  before = _engine_logprobs(parts, probe)

  source = SyncSource(config, generator=parts.generator, env=parts.env, tokenizer=parts.tokenizer, train_tasks=tasks)
  result = grpo_train(config, source=source, policy=parts.policy, generator=parts.generator,
                      synchronizer=parts.synchronizer, env=parts.env, tokenizer=parts.tokenizer,
                      train_tasks=tasks, val_tasks=[], workdir=str(tmp_path), losses=(pg_loss, nll),
                      progress=False)
  assert result.steps == config.grpo.max_num_steps

  rows = [json.loads(line) for line in open(os.path.join(tmp_path, "metrics.jsonl"))]
  steps = [r for r in rows if "groups/zero_variance_fraction" in r]
  assert len(steps) == config.grpo.max_num_steps
  summary = [(r["step"], r["groups/zero_variance_fraction"], r["reward/raw_mean"],
              r["reward/malformed_fraction"]) for r in steps]
  # Non-zero-variance groups: some completions of one prompt scored differently in the sandbox.
  assert min(r["groups/zero_variance_fraction"] for r in steps) < 1.0, summary
  assert any("train/loss" in r for r in steps), "no GRPO step trained"

  after = _engine_logprobs(parts, probe)
  trainer = _trainer_logprobs(parts, probe)
  # The weights vLLM serves moved with the GRPO steps, and they are the trainer's weights.
  assert np.abs(after - before).max() > 1e-3, "vLLM's logprobs did not change after GRPO steps"
  assert np.abs(after - trainer).max() < config.refit.canary.max_abs_logprob_delta
  assert steps[-1]["weight_version"] >= 2   # SFT refit = version 1; GRPO steps push more
