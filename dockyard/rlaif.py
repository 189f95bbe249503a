"""RLAIF, constitutional style: the model critiques and revises its own answers against a written
constitution; (revision, original answer) become preference pairs for the DPO family.

configs/rlaif.py is configs/dpo.py with an `rlaif` section: before the DPO loop
(`dpo.loop.dpo_train`, as configs/dpo.py runs it), the initial weights serve a vLLM engine in this
process (no Ray, as configs/sft.py's generation metric) and, for each prompt of the env's train and
held-out splits (`rlaif.num_train_prompts`, `rlaif.num_val_prompts` of them):

  1. answer    the model answers the prompt (sampled at `rlaif.temperature`);
  2. critique  in the same conversation it is asked to critique its answer against one principle of
               `rlaif.constitution` (the principles taken in turn, prompt by prompt);
  3. revise    then to rewrite the answer so that it follows that principle.

chosen = the revision, rejected = the original answer, both as replies to the original prompt
alone; a pair whose two replies are equal or empty is dropped (`make_pairs` reports how many). The
held-out prompts' pairs are the DPO loop's validation: `val/chosen_preferred` is how often the
policy gives its own revision the higher logprob. The pairs and every critique are written to
`<workdir>/rlaif_pairs.jsonl`. This is the supervised half of Constitutional AI (Bai et al. 2022)
feeding a preference loss, the critic being the policy itself; no human labels. A resumed run
trains on the pairs its first start wrote (`runner.model_made_pairs`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from dockyard.dpo.data import PreferencePair
from dockyard.rollout.base import SamplingParams
from dockyard.rollout.chat import encode_prompt

RECORDS = "rlaif_pairs.jsonl"   # in the workdir: every prompt's answer, critique, revision; the pairs
CRITIQUE = ("Critique your answer above against this principle: {principle} "
            "Say briefly where it falls short.")
REVISE = ("Rewrite your answer to the original request so that it follows the principle: {principle} "
          "Reply with the rewritten answer only.")


@dataclasses.dataclass(frozen=True)
class RlaifConfig:
  constitution: tuple[str, ...]
  temperature: float
  max_new_tokens: int
  num_train_prompts: int
  num_val_prompts: int

  def __post_init__(self):
    if not self.constitution or not all(isinstance(p, str) and p.strip() for p in self.constitution):
      raise ValueError("rlaif.constitution must be one or more non-empty principles")
    if not self.temperature > 0:
      raise ValueError(f"rlaif.temperature must be > 0 (answers are sampled), got {self.temperature}")
    if self.max_new_tokens < 1:
      raise ValueError(f"rlaif.max_new_tokens must be >= 1, got {self.max_new_tokens}")
    if self.num_train_prompts < 1 or self.num_val_prompts < 0:
      raise ValueError("rlaif.num_train_prompts must be >= 1 and rlaif.num_val_prompts >= 0")

  @classmethod
  def from_config(cls, rlaif) -> "RlaifConfig":
    return cls(constitution=tuple(rlaif.constitution), temperature=float(rlaif.temperature),
               max_new_tokens=int(rlaif.max_new_tokens), num_train_prompts=int(rlaif.num_train_prompts),
               num_val_prompts=int(rlaif.num_val_prompts))


def make_pairs(engine, tokenizer, prompts: Sequence[Sequence[Mapping[str, str]]], cfg: RlaifConfig,
               seed: int) -> tuple[list[PreferencePair], list[dict[str, Any]]]:
  """(pairs, records): one (revision, answer) pair per prompt (chat messages) whose revision differs
  from its answer; `records` holds every prompt's answer, principle, critique and revision."""
  sampling = SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_new_tokens, seed=seed)

  def complete(conversations):
    ids = [encode_prompt(tokenizer, c) for c in conversations]
    out = engine.generate(ids, 1, sampling)
    return [tokenizer.decode(group[0].token_ids, skip_special_tokens=True).strip() for group in out]

  prompts = [list(p) for p in prompts]
  principles = [cfg.constitution[i % len(cfg.constitution)] for i in range(len(prompts))]
  answers = complete(prompts)
  asked = [p + [{"role": "assistant", "content": a},
                {"role": "user", "content": CRITIQUE.format(principle=r)}]
           for p, a, r in zip(prompts, answers, principles)]
  critiques = complete(asked)
  revised = complete([c + [{"role": "assistant", "content": k},
                           {"role": "user", "content": REVISE.format(principle=r)}]
                      for c, k, r in zip(asked, critiques, principles)])
  pairs, records = [], []
  for p, a, r, k, v in zip(prompts, answers, principles, critiques, revised):
    kept = bool(a) and bool(v) and a != v
    records.append(dict(messages=p, answer=a, principle=r, critique=k, revision=v, kept=kept,
                        pairs=[[v, a]] if kept else []))
    if kept:
      pairs.append(PreferencePair(tuple(p), chosen=v, rejected=a))
  return pairs, records
