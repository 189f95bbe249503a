"""Reward-model pairs: `dockyard.dpo.data`'s preference pairs plus an optional per-pair margin.

The pairs, their sources and their encoding are the DPO family's (`dockyard.dpo.data`): the math
env's pairs when `config.data.train` is '' (chosen the gold answer, rejected the gold answer off
by a seeded 1..3), or the user's JSONL in TRL's preference schema. A JSONL record may add TRL's
`"margin"` (a finite number, default 0): how much more the chosen completion must score than the
rejected one (`rm.loss_spec`). `make_batch` packs pairs as `dpo.data.make_pair_batch` does
(right-padded, row 2i chosen, 2i+1 rejected) with extras["margin"] [pairs].
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np

from dockyard.data import jsonl
from dockyard.dpo import data as pair_data
from dockyard.policy import TrainBatch


@dataclasses.dataclass(frozen=True)
class MarginPair:
  pair: pair_data.PreferencePair
  margin: float = 0.0


_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
         "fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def in_words(n: int) -> str:
  """An integer in English words: 7 -> 'seven', -42 -> 'minus forty-two', 1203 -> 'one thousand
  two hundred three'."""
  if n < 0:
    return "minus " + in_words(-n)
  if n < 20:
    return _ONES[n]
  if n < 100:
    return _TENS[n // 10] + ("-" + _ONES[n % 10] if n % 10 else "")
  for size, name in ((10 ** 9, "billion"), (10 ** 6, "million"), (1000, "thousand"), (100, "hundred")):
    if n >= size:
      head, rest = divmod(n, size)
      return f"{in_words(head)} {name}" + (f" {in_words(rest)}" if rest else "")
  raise AssertionError(n)


def math_pairs(env, tasks) -> list[MarginPair]:
  """One pair per task of the math env (margin 0): chosen its gold completion ("7"), rejected the
  same answer in words ("seven"), which the env's integer extraction cannot read (reward 0,
  malformed). A format preference a tiny random-init model learns and carries to held-out sums;
  the DPO pairs' "off by 1-3" preference asks it to learn addition, which it does not in a
  minute (docs/rm.md)."""
  return [MarginPair(pair_data.PreferencePair(tuple(env.prompt_messages(t)), env.gold_completion(t),
                                              env.gold_completion(t).replace(str(t["answer"]), in_words(int(t["answer"])))))
          for t in tasks]


def pair_from_record(record: Any, where: str) -> MarginPair:
  """A TRL-schema record (`dpo.data.pair_from_record`) with an optional numeric "margin"."""
  pair = pair_data.pair_from_record(record, where)
  margin = record.get("margin", 0.0)
  if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin):
    raise pair_data.PairDataError(f"{where}: 'margin' must be a finite number, got {margin!r:.80}")
  return MarginPair(pair, float(margin))


def read_jsonl(path: str) -> list[MarginPair]:
  """The pairs of a TRL-schema JSONL file; a bad line is a PairDataError naming it."""
  return jsonl.read_records(path, pair_from_record, pair_data.PairDataError, "preference pairs")


@dataclasses.dataclass(frozen=True)
class EncodedMarginPair:
  encoded: pair_data.EncodedPair
  margin: float


def encode(tokenizer, pairs: Sequence[MarginPair], max_seq_len: int) -> list[EncodedMarginPair]:
  """Token ids (`dpo.data.encode_pairs`: chat-template prompt, completion + EOS) with the margins."""
  encoded = pair_data.encode_pairs(tokenizer, [p.pair for p in pairs], max_seq_len)
  return [EncodedMarginPair(e, p.margin) for e, p in zip(encoded, pairs)]


def make_batch(pairs: Sequence[EncodedMarginPair], pad_id: int, pad_multiple: int = 1) -> TrainBatch:
  """Interleaved right-padded rows (`dpo.data.make_pair_batch`) + extras["margin"] [pairs]."""
  batch = pair_data.make_pair_batch([p.encoded for p in pairs], pad_id, pad_multiple)
  batch.extras["margin"] = np.asarray([p.margin for p in pairs], np.float32)
  return batch
