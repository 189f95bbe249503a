"""Preference pairs from the policy's own samples, judged by the environment's verifier.

configs/dpo.py with a `sampled_pairs` section (`:smollm`): before the DPO loop, the initial weights
serve a vLLM engine in this process (the one the generation metric then reuses) and, for each of
`num_train_prompts` train and `num_val_prompts` held-out tasks of env.math, sample
`num_samples` completions at `temperature` and score each with the env (0/1 correctness). From a
task whose samples hold both a right and a wrong answer: up to `pairs_per_prompt` pairs, chosen =
a right completion, rejected = a wrong one (distinct texts; drawn with a seeded generator, no
completion used twice on one side); a task with only right or only wrong samples gives none. The
held-out tasks' pairs are validation's (`val/chosen_preferred`: how often the policy prefers its
own right answer to its own wrong one on questions it never trained on).

Every task's samples, rewards and pairs go to `<workdir>/sampled_pairs.jsonl` (`RECORDS`); a resumed
run reads its pairs back from there (`runner.sampled_pairs`) rather than sampling again. This is
the "pairs built from the model's own correct vs wrong samples" recipe (rejection-sampled pairs,
as in RSO / the iterative-DPO line of work), one round, offline.
"""
from __future__ import annotations

import asyncio
import dataclasses
import random
from typing import Any, Mapping, Sequence

from dockyard.dpo.data import PreferencePair
from dockyard.rollout.base import SamplingParams
from dockyard.rollout.chat import decode, encode_prompt

RECORDS = "sampled_pairs.jsonl"   # in the workdir: every task's samples, their rewards, its pairs


@dataclasses.dataclass(frozen=True)
class SampledPairsConfig:
  num_samples: int          # completions per task (>= 2: a pair needs a right and a wrong one)
  temperature: float
  num_train_prompts: int    # of env.math's train split
  num_val_prompts: int      # of its held-out split: validation's pairs
  pairs_per_prompt: int     # at most this many pairs from one task

  def __post_init__(self):
    if self.num_samples < 2:
      raise ValueError(f"sampled_pairs.num_samples must be >= 2 (a pair is a right and a wrong sample), "
                       f"got {self.num_samples}")
    if not self.temperature > 0:
      raise ValueError(f"sampled_pairs.temperature must be > 0 (greedy samples are all the same), "
                       f"got {self.temperature}")
    if self.num_train_prompts < 1 or self.num_val_prompts < 0:
      raise ValueError("sampled_pairs.num_train_prompts must be >= 1 and sampled_pairs.num_val_prompts >= 0")
    if self.pairs_per_prompt < 1:
      raise ValueError(f"sampled_pairs.pairs_per_prompt must be >= 1, got {self.pairs_per_prompt}")

  @classmethod
  def from_config(cls, section) -> "SampledPairsConfig":
    return cls(num_samples=int(section.num_samples), temperature=float(section.temperature),
               num_train_prompts=int(section.num_train_prompts), num_val_prompts=int(section.num_val_prompts),
               pairs_per_prompt=int(section.pairs_per_prompt))


def pair_up(right: Sequence[str], wrong: Sequence[str], k: int, rng: random.Random) -> list[tuple[str, str]]:
  """Up to `k` (chosen, rejected) pairs from a task's distinct right and wrong texts, each text on
  its side at most once."""
  right, wrong = sorted(set(right)), sorted(set(wrong))
  rng.shuffle(right)
  rng.shuffle(wrong)
  return list(zip(right, wrong))[:k]


def make_pairs(engine, tokenizer, env, tasks: Sequence[Mapping[str, Any]], cfg: SampledPairsConfig,
               max_new_tokens: int, seed: int) -> tuple[list[PreferencePair], list[dict[str, Any]]]:
  """(pairs, records) for `tasks`: `cfg.num_samples` sampled completions each, scored by `env`;
  `records` holds every task's samples with their rewards and the pairs it gave."""
  if not tasks:
    return [], []
  messages = [env.prompt_messages(t) for t in tasks]
  sampling = SamplingParams(temperature=cfg.temperature, top_p=1.0, max_tokens=max_new_tokens, seed=seed)
  groups = engine.generate([encode_prompt(tokenizer, m) for m in messages], cfg.num_samples, sampling)
  texts = [[decode(tokenizer, c).strip() for c in group] for group in groups]

  async def score_all():
    return await asyncio.gather(*(asyncio.gather(*(env.score(t, x) for x in xs)) for t, xs in zip(tasks, texts)))

  rewards = asyncio.run(score_all())
  rng = random.Random(seed)
  pairs, records = [], []
  for task, msgs, xs, rs in zip(tasks, messages, texts, rewards):
    right = [x for x, r in zip(xs, rs) if x and env.is_success(r)]
    wrong = [x for x, r in zip(xs, rs) if x and not env.is_success(r)]
    made = pair_up(right, wrong, cfg.pairs_per_prompt, rng)
    pairs.extend(PreferencePair(tuple(msgs), c, r) for c, r in made)
    records.append(dict(task=task.get("instance_id", task.get("question")), messages=msgs,
                        samples=xs, rewards=[r.value for r in rs], pairs=[list(p) for p in made]))
  return pairs, records
