"""SFT warm start (`config.grpo.sft_warmup`): a few steps of masked NLL on (prompt, gold answer).

A random-init tiny model almost never samples a right answer, so GRPO would see only flat groups;
a short SFT on the training split's gold answers gets it to the format and some accuracy first.
The environment supplies the target through `gold_completion(task)`: each task becomes a chat, the
env's prompt then the gold answer as the assistant turn (`gold_messages`), encoded by
`dockyard.conversation` (the tokens of the assistant turn's content and its end-of-turn EOS are
trained; the prompt is context only). The loss is the NLL on those tokens, normalized per the
micro-batching contract.

This is the data and loop code of configs/sft.py too: `dockyard.supervised` builds its batches with
`gold_messages` and `pack_conversations`, and its steps, like these, are `dockyard.sft.sft_loop`,
the one SFT loop (the standalone `dockyard.trainer_jax.sft` runs it too); this module supplies the
batches and the per-step metrics. The warm start runs at
`sft_warmup.lr` through the Policy seam's `set_lr` (None afterwards returns to the policy's
schedule).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from dockyard.conversation import EncodedConversation, encode_conversation
from dockyard.grpo.batch import pack_sequences
from dockyard.policy import LossFn, Policy, TrainBatch
from dockyard.sft import sft_loop


def gold_messages(env, task: Mapping[str, Any]) -> list[dict[str, str]]:
  """The task as a chat: the env's prompt messages, then its gold answer as the assistant turn."""
  return [*env.prompt_messages(task), {"role": "assistant", "content": env.gold_completion(task)}]


def pack_conversations(conversations: Sequence[EncodedConversation], pad_id: int,
                       pad_multiple: int = 1) -> TrainBatch:
  """Right-padded rows with each conversation's assistant mask as the loss mask
  (`batch.pack_sequences`: the first token is the row's "prompt", which nothing before predicts)."""
  return pack_sequences([c.ids[:1] for c in conversations], [c.ids[1:] for c in conversations],
                        pad_id, pad_multiple, completion_masks=[c.mask[1:] for c in conversations])


def make_sft_batch(env, tokenizer, tasks: Sequence[Mapping[str, Any]], pad_multiple: int = 1) -> TrainBatch:
  """The tasks' gold chats; loss on the answer and its end-of-turn EOS (the chat template's)."""
  pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
  return pack_conversations([encode_conversation(tokenizer, gold_messages(env, task)) for task in tasks],
                            pad_id, pad_multiple)


def pack_episodes(episodes, pad_id: int, pad_multiple: int = 1) -> TrainBatch:
  """Agent episodes (`dockyard.agent.episode.Episode`) as SFT rows: each trajectory's prompt, then
  its turns and tool results token for token, the loss on the model's tokens only."""
  return pack_sequences([e.trajectory.prompt_ids for e in episodes], [e.trajectory.token_ids for e in episodes],
                        pad_id, pad_multiple, completion_masks=[e.trajectory.loss_mask for e in episodes])


def sft_warmup(policy: Policy, env, tokenizer, tasks: Sequence[Any], *, steps: int,
               batch_size: int, lr: float, loss_fn: LossFn, seed: int = 0, pad_multiple: int = 16,
               on_step: Callable[[int, dict], None] | None = None,
               make_batch: Callable[[list], TrainBatch] | None = None) -> list[dict[str, float]]:
  """Runs `steps` SFT steps on random batches of `tasks`; returns each step's metrics.
  `make_batch(items)` builds a batch from some of `tasks` (default: their gold chats,
  `make_sft_batch`; an agent config's warm start passes oracle episodes and `pack_episodes`)."""
  if steps <= 0:
    return []
  if batch_size < 1:
    raise ValueError(f"grpo.sft_warmup.batch_size must be >= 1, got {batch_size}")
  if not tasks:
    raise ValueError("SFT warm start: no training tasks")
  rng = np.random.default_rng(seed)

  def next_batch() -> TrainBatch:
    idx = rng.choice(len(tasks), size=min(batch_size, len(tasks)), replace=False)
    if make_batch is not None:
      return make_batch([tasks[i] for i in idx])
    return make_sft_batch(env, tokenizer, [tasks[i] for i in idx], pad_multiple)

  history = []

  def record(step: int, metrics: dict[str, float], seconds: float) -> None:
    history.append({**metrics, "time_s": seconds})
    if on_step is not None:
      on_step(step, history[-1])
  sft_loop(policy, next_batch, range(steps), loss_fn, lr=lr, on_step=record)
  return history
