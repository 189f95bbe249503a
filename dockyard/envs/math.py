"""An in-process arithmetic verifier environment ("What is 37 + 48?" -> reward 1 if right).

Its data set is generated deterministically from a seed (`config.env.math`) and split into
disjoint train / validation sets of distinct questions. The prompt is the question, then the
optional `instruction` ("Answer with the number only."), as the user turn of the tokenizer's chat
template (with `system_prompt` as a system turn when set).

The reward reads ONE final answer, so a reply cannot hedge by listing candidates:
`answer_extraction="last_integer"` (default) takes the last integer of the completion ("The
answer is 85." and "37 + 48 = 85" both count; "85 or 86" reads 86); `"answer_tag"` takes only
the integer right after the last "Answer:" and treats a reply without one as malformed. A
completion with no answer to read is malformed (reward 0, `malformed=True`, so shaping can
penalize it). Small and fast: it is what shows learning on a 2-core machine (`configs/math.py`)
and exercises the GRPO loop without a sandbox.

Beyond `Environment`, it offers what the loop uses when an env has it:
`gold_completion(task)` (the SFT warm start's target) and `validation_metrics(rewards)`; its
reward is 0/1 correctness, so `Environment.is_success` (reward >= 1) is what pass@k counts.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, Sequence

import numpy as np

from dockyard.envs.base import Environment, Reward

GOLD_FORMATS = ("answer", "equation")
EXTRACTIONS = ("last_integer", "answer_tag")
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
_INT = re.compile(r"-?\d+")
_TAGGED = re.compile(r"Answer:\s*(-?\d+)", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class MathConfig:
  seed: int = 0
  ops: tuple[str, ...] = ("+",)
  min_operand: int = 0
  max_operand: int = 9
  num_train: int = 80
  num_validation: int = 20
  system_prompt: str = ""          # '' : no system message (shortest prompt for tiny models)
  # The SFT warm start's target: "answer" ("7") or "equation" ("3 + 4 = 7": the operands restated
  # next to the result, a worked answer). The reward reads the last integer either way.
  gold_format: str = "answer"
  instruction: str = ""            # appended to the question in the user turn ('' : the question alone)
  answer_extraction: str = "last_integer"   # last_integer | answer_tag (see the module docstring)

  def __post_init__(self):
    bad = [o for o in self.ops if o not in OPS]
    if not self.ops or bad:
      raise ValueError(f"env.math.ops must be a non-empty subset of {sorted(OPS)}, got {self.ops}")
    if self.min_operand > self.max_operand:
      raise ValueError(f"env.math.min_operand ({self.min_operand}) > max_operand ({self.max_operand})")
    if self.gold_format not in GOLD_FORMATS:
      raise ValueError(f"env.math.gold_format must be one of {GOLD_FORMATS}, got {self.gold_format!r}")
    if self.answer_extraction not in EXTRACTIONS:
      raise ValueError(f"env.math.answer_extraction must be one of {EXTRACTIONS}, got "
                       f"{self.answer_extraction!r}")
    if self.num_train < 1 or self.num_validation < 0:
      raise ValueError(f"env.math.num_train must be >= 1 and num_validation >= 0, got "
                       f"{self.num_train}, {self.num_validation}")
    space = len(self.ops) * (self.max_operand - self.min_operand + 1) ** 2
    if self.num_train + self.num_validation > space:
      raise ValueError(f"env.math.num_train + num_validation ({self.num_train + self.num_validation}) "
                       f"exceeds the {space} distinct questions of ops={self.ops} with operands in "
                       f"[{self.min_operand}, {self.max_operand}]")

  @classmethod
  def from_config(cls, config) -> "MathConfig":
    math_cfg = config.env.math
    return cls(seed=int(math_cfg.seed), ops=tuple(math_cfg.ops), min_operand=int(math_cfg.min_operand),
               max_operand=int(math_cfg.max_operand), num_train=int(math_cfg.num_train),
               num_validation=int(math_cfg.num_validation), system_prompt=str(math_cfg.system_prompt),
               gold_format=str(math_cfg.get("gold_format", "answer")),
               instruction=str(math_cfg.get("instruction", "")),
               answer_extraction=str(math_cfg.get("answer_extraction", "last_integer")))


def make_task(a: int, op: str, b: int) -> dict[str, Any]:
  return dict(instance_id=f"math-{a}{op}{b}", question=f"What is {a} {op} {b}?", answer=OPS[op](a, b),
              equation=f"{a} {op} {b}")


def make_dataset(cfg: MathConfig) -> tuple[list[dict], list[dict]]:
  """(train, validation): distinct questions, the same for the same config on any machine."""
  rng = np.random.default_rng(cfg.seed)
  lo, hi = cfg.min_operand, cfg.max_operand
  need = cfg.num_train + cfg.num_validation
  width = hi - lo + 1
  space = len(cfg.ops) * width * width
  if space <= 200_000:   # enumerate and permute: exact, no rejection loop
    picks = rng.permutation(space)[:need]
  else:                  # sample distinct indices without materializing the whole space
    picks = rng.choice(space, size=need, replace=False)
  tasks = []
  for idx in picks.tolist():
    op_i, rest = divmod(idx, width * width)
    a, b = divmod(rest, width)
    tasks.append(make_task(lo + a, cfg.ops[op_i], lo + b))
  return tasks[:cfg.num_train], tasks[cfg.num_train:]


def parse_answer(completion: str, extraction: str = "last_integer") -> int | None:
  """The completion's final answer (see the module docstring), or None when there is none."""
  found = (_INT if extraction == "last_integer" else _TAGGED).findall(completion)
  return int(found[-1]) if found else None


class MathEnv(Environment):
  """Scores arithmetic answers in-process."""

  def __init__(self, cfg: MathConfig | None = None):
    self.cfg = cfg or MathConfig()
    self.train, self.validation = make_dataset(self.cfg)

  def prompt_messages(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
    if "question" not in task:
      raise KeyError(f"math task {task.get('instance_id', task)!r} has no 'question'")
    messages = [{"role": "system", "content": self.cfg.system_prompt}] if self.cfg.system_prompt else []
    content = f"{task['question']} {self.cfg.instruction}" if self.cfg.instruction else task["question"]
    return messages + [{"role": "user", "content": content}]

  def gold_completion(self, task: Mapping[str, Any]) -> str:
    if self.cfg.gold_format == "equation":
      gold = f"{task['equation']} = {task['answer']}"
    else:
      gold = str(task["answer"])
    return f"Answer: {gold}" if self.cfg.answer_extraction == "answer_tag" else gold

  async def score(self, task: Mapping[str, Any], completion: str) -> Reward:
    got = parse_answer(completion, self.cfg.answer_extraction)
    if got is None:
      what = "no integer" if self.cfg.answer_extraction == "last_integer" else "no 'Answer: <integer>'"
      return Reward(0.0, info=dict(reason=f"{what} in the completion"),
                    components=dict(correct=0.0, format=0.0), malformed=True)
    correct = float(got == int(task["answer"]))
    return Reward(correct, info=dict(parsed=got, answer=int(task["answer"])),
                  components=dict(correct=correct, format=1.0))

  def validation_metrics(self, rewards: Sequence[Reward]) -> dict[str, float]:
    n = max(len(rewards), 1)
    return dict(accuracy=sum(r.value for r in rewards) / n,
                malformed_fraction=sum(r.malformed for r in rewards) / n)

