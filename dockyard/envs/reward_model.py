"""`RewardModelEnv`: another environment's tasks, scored by a trained reward model.

Prompts, tasks and gold completions are the wrapped env's; the reward of a completion is the
reward model's scalar (`dockyard.rm.model.RewardModel`, e.g. the `<workdir>/reward_model` that
configs/rm.py saves) of the prompt (the env's chat prompt through the tokenizer's chat template,
`rollout.chat.encode_prompt`) followed by the completion's tokens and EOS: the sequences the
model was trained on (`dpo.data.encode_pairs`). Scoring runs in this process; the scorings that
are awaited together (GRPO's `score_groups` gathers a step's) go to the model as batches of up to
`batch_size` rows, off the event loop (`asyncio.to_thread`).

The wrapped env still scores every completion: its reward is kept in `Reward.info`
(`env_reward`, `env_malformed`, and its info as `env_<key>`), so `is_success` (pass@k) and
`validation_metrics` report the task's own verdict while the training signal is the model's.
The reward model's scalar is unbounded (not 0/1), and a completion longer than `max_seq_len`
with its prompt is cut to fit (its tail is dropped, EOS kept).
"""
from __future__ import annotations

import asyncio
from typing import Any, Mapping, Sequence

import numpy as np

from dockyard.envs.base import Environment, Reward
from dockyard.policy import TrainBatch
from dockyard.rollout.chat import encode_prompt


def _right_padded(rows: Sequence[list[int]], pad_id: int) -> TrainBatch:
  # The layout of grpo.batch.pack_sequences, built here (dockyard.grpo imports dockyard.envs); a
  # reward model reads input_ids and attention_mask only.
  t = max(len(r) for r in rows)
  ids = np.full((len(rows), t), pad_id, np.int32)
  mask = np.zeros((len(rows), t), np.int32)
  for i, r in enumerate(rows):
    ids[i, :len(r)], mask[i, :len(r)] = r, 1
  return TrainBatch(input_ids=ids, attention_mask=mask, loss_mask=mask.astype(np.float32))


class RewardModelEnv(Environment):

  def __init__(self, base: Environment, model, tokenizer, max_seq_len: int, batch_size: int = 32):
    if tokenizer.eos_token_id is None:
      raise ValueError("the tokenizer has no eos_token_id; the reward model scores completion + EOS")
    self.base, self.model, self.tokenizer = base, model, tokenizer
    self.max_seq_len, self.batch_size = int(max_seq_len), max(1, int(batch_size))
    self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    self._pending: list[tuple[list[int], list[int], asyncio.Future]] = []
    self.batches_scored = 0   # model calls made (a test reads it to see that scorings were batched)

  def prompt_messages(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
    return self.base.prompt_messages(task)

  def gold_completion(self, task: Mapping[str, Any]) -> str:
    return self.base.gold_completion(task)

  def _ids(self, task, completion: str) -> tuple[list[int], list[int]]:
    prompt = encode_prompt(self.tokenizer, self.prompt_messages(task))
    room = self.max_seq_len - len(prompt) - 1
    if room < 0:
      raise ValueError(f"task {task.get('instance_id', '?')!r}: its prompt has {len(prompt)} tokens, "
                       f"more than max_seq_len={self.max_seq_len} allows with a completion")
    ids = self.tokenizer.encode(completion, add_special_tokens=False)[:room]
    return prompt, [*ids, self.tokenizer.eos_token_id]

  async def _flush(self) -> None:
    pending, self._pending = self._pending, []
    for i in range(0, len(pending), self.batch_size):
      chunk = pending[i:i + self.batch_size]
      try:
        batch = _right_padded([p + c for p, c, _ in chunk], self.pad_id)
        values = await asyncio.to_thread(self.model.rewards, batch)
        self.batches_scored += 1
        for (_, _, fut), v in zip(chunk, values):
          if not fut.done():   # a scoring cancelled meanwhile (a timeout) takes no result
            fut.set_result(float(v))
      except Exception as e:  # noqa: BLE001 — every waiting scoring gets the error
        for _, _, fut in chunk:
          if not fut.done():
            fut.set_exception(e)

  async def _model_reward(self, prompt: list[int], completion: list[int]) -> float:
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    self._pending.append((prompt, completion, fut))
    if len(self._pending) == 1:   # the first of this tick's scorings schedules the batch
      loop.call_soon(lambda: asyncio.ensure_future(self._flush()))
    return await fut

  async def score(self, task: Mapping[str, Any], completion: str) -> Reward:
    prompt, ids = self._ids(task, completion)
    value, env = await asyncio.gather(self._model_reward(prompt, ids), self.base.score(task, completion))
    info = {"env_reward": env.value, "env_malformed": env.malformed,
            **{f"env_{k}": v for k, v in env.info.items()}}
    return Reward(value=value, info=info)

  def _env_reward(self, reward: Reward) -> Reward:
    info = {k.removeprefix("env_"): v for k, v in reward.info.items()
            if k.startswith("env_") and k not in ("env_reward", "env_malformed")}
    return Reward(value=reward.info["env_reward"], info=info, malformed=reward.info["env_malformed"])

  def is_success(self, reward: Reward) -> bool:
    return self.base.is_success(self._env_reward(reward))

  def validation_metrics(self, rewards: Sequence[Reward]) -> dict[str, float]:
    env_rewards = [self._env_reward(r) for r in rewards]
    out = dict(self.base.validation_metrics(env_rewards))
    if rewards:
      out["env_reward"] = sum(r.value for r in env_rewards) / len(env_rewards)
      out["reward_model"] = sum(r.value for r in rewards) / len(rewards)
    return out

  async def close(self) -> None:
    await self.base.close()
