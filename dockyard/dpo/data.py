"""Preference pairs for the DPO family: where they come from and how they become a `TrainBatch`.

Two sources (`config.data.train`):
  math_pairs   '' (the default): pairs made from the arithmetic env's splits (`dockyard.envs.math`,
               `config.env.math`): the prompt is the env's chat prompt, chosen its gold answer,
               rejected the gold answer off by a seeded nonzero offset (at most `MAX_OFFSET`).
               Deterministic, no download: the tiny default of configs/dpo.py.
  read_jsonl   a path: the user's pairs in TRL's preference schema, one JSON object a line,
               {"prompt": str | [{"role", "content"}, ...], "chosen": str, "rejected": str}
               (a string prompt is one user turn; chosen / rejected may also be TRL's
               conversational one-message list [{"role": "assistant", "content": str}]). A bad
               record is a `PairDataError` naming its file and line.

`encode_pairs` renders each prompt with the tokenizer's chat template (`rollout.chat.encode_prompt`,
the encoder GRPO samples from) and appends EOS to each completion; `make_pair_batch` packs pairs
right-padded and interleaved, row 2i the chosen and 2i+1 the rejected completion of pair i (the
layout of `dpo/loss_spec.py`), the loss mask on the completion tokens only.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from dockyard.data import jsonl
from dockyard.grpo.batch import pack_sequences
from dockyard.grpo.step import PromptSampler
from dockyard.policy import TrainBatch
from dockyard.rollout.chat import encode_prompt

MAX_OFFSET = 3   # math pairs: the rejected answer is gold +- 1..MAX_OFFSET


class PairDataError(ValueError):
  """A preference record that cannot be used; the message starts with where it is (file:line)."""


@dataclasses.dataclass(frozen=True)
class PreferencePair:
  messages: tuple[Mapping[str, str], ...]   # the prompt as chat messages (no assistant reply)
  chosen: str
  rejected: str


@dataclasses.dataclass(frozen=True)
class EncodedPair:
  prompt: list[int]      # chat-template ids, ready for the assistant turn
  chosen: list[int]      # completion ids + EOS
  rejected: list[int]


def math_pairs(env, tasks: Sequence[Mapping[str, Any]], seed: int) -> list[PreferencePair]:
  """One pair per task of the math env: gold answer vs the gold answer off by a seeded offset in
  +-[1, MAX_OFFSET], written as the env writes its gold answers (`gold_completion`)."""
  rng = np.random.default_rng(seed)
  pairs = []
  for task in tasks:
    offset = int(rng.integers(1, MAX_OFFSET + 1)) * (1 if rng.random() < 0.5 else -1)
    wrong = {**task, "answer": int(task["answer"]) + offset}
    pairs.append(PreferencePair(tuple(env.prompt_messages(task)), env.gold_completion(task),
                                env.gold_completion(wrong)))
  return pairs


def _completion(value: Any, key: str, where: str) -> str:
  if isinstance(value, list) and len(value) == 1 and isinstance(value[0], Mapping) \
      and value[0].get("role") == "assistant":
    value = value[0].get("content")   # TRL's conversational form: one assistant message
  if not isinstance(value, str) or not value:
    raise PairDataError(f"{where}: {key!r} must be a non-empty string (or [{{'role': 'assistant', "
                        f"'content': str}}]), got {value!r:.80}")
  return value


def _messages(prompt: Any, where: str) -> tuple[dict[str, str], ...]:
  if isinstance(prompt, str) and prompt:
    return ({"role": "user", "content": prompt},)
  if isinstance(prompt, list) and prompt:
    for i, m in enumerate(prompt):
      if not (isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
        raise PairDataError(f"{where}: prompt message {i} must be {{'role': str, 'content': str}}, "
                            f"got {m!r:.80}")
    if prompt[-1]["role"] == "assistant":
      raise PairDataError(f"{where}: the prompt ends with an assistant message; the completions "
                          f"('chosen', 'rejected') are the assistant's reply")
    return tuple({"role": m["role"], "content": m["content"]} for m in prompt)
  raise PairDataError(f"{where}: 'prompt' must be a non-empty string or a list of chat messages, "
                      f"got {prompt!r:.80}")


def pair_from_record(record: Any, where: str) -> PreferencePair:
  """One TRL-schema record -> a PreferencePair; errors start with `where`."""
  if not isinstance(record, Mapping):
    raise PairDataError(f"{where}: expected a JSON object with 'prompt', 'chosen', 'rejected', got "
                        f"{type(record).__name__}")
  missing = [k for k in ("prompt", "chosen", "rejected") if k not in record]
  if missing:
    raise PairDataError(f"{where}: missing {missing} (has {sorted(record)})")
  chosen, rejected = _completion(record["chosen"], "chosen", where), _completion(record["rejected"], "rejected", where)
  if chosen == rejected:
    raise PairDataError(f"{where}: 'chosen' and 'rejected' are the same text; the pair prefers nothing")
  return PreferencePair(_messages(record["prompt"], where), chosen, rejected)


def read_jsonl(path: str) -> list[PreferencePair]:
  """The pairs of a TRL-schema JSONL file (blank lines skipped); raises PairDataError at the first
  bad line, naming it."""
  return jsonl.read_records(path, pair_from_record, PairDataError, "preference pairs")


def encode_pairs(tokenizer, pairs: Sequence[PreferencePair], max_seq_len: int) -> list[EncodedPair]:
  """Token ids of each pair (chat-template prompt; completion + EOS); a pair longer than
  `max_seq_len` (prompt + the longer completion) is an error naming it."""
  if tokenizer.eos_token_id is None:
    raise ValueError("the tokenizer has no eos_token_id; completions must end with EOS")
  out = []
  for i, pair in enumerate(pairs):
    prompt = encode_prompt(tokenizer, pair.messages)
    chosen, rejected = ([*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
                        for text in (pair.chosen, pair.rejected))
    longest = len(prompt) + max(len(chosen), len(rejected))
    if longest > max_seq_len:
      raise ValueError(f"preference pair {i}: {longest} tokens (prompt {len(prompt)} + completion) "
                       f"exceed policy.max_seq_len={max_seq_len}")
    out.append(EncodedPair(prompt, chosen, rejected))
  return out


def make_pair_batch(pairs: Sequence[EncodedPair], pad_id: int, pad_multiple: int = 1) -> TrainBatch:
  """Right-padded rows, row 2i chosen and 2i+1 rejected; loss mask on the completion tokens."""
  prompts = [p.prompt for p in pairs for _ in range(2)]
  completions = [c for p in pairs for c in (p.chosen, p.rejected)]
  return pack_sequences(prompts, completions, pad_id, pad_multiple)


class PairSampler:
  """The pair indices of each step, in `grpo.step.PromptSampler`'s order (epochs of seeded
  permutations, an epoch's tail continuing into the next) but addressed by step: a function of
  (seed, step) only, so a resumed run draws what the uninterrupted one would have."""

  def __init__(self, num_pairs: int, per_step: int, seed: int):
    if num_pairs < 1:
      raise ValueError("no training pairs")
    self.num_pairs, self.per_step = num_pairs, per_step
    self._order = PromptSampler(range(num_pairs), seed)

  def indices(self, step: int) -> list[int]:
    """The pair indices of 1-based `step`."""
    epoch, pos = divmod((step - 1) * self.per_step, self.num_pairs)
    self._order.load(dict(epoch=epoch, pos=pos))
    return [int(i) for i in self._order.next(self.per_step)]
