"""A multiple-choice environment with an `Answer: X` verifier, on locally generated questions.

Each question has `num_choices` options labelled A, B, ... and exactly one right one:

  kind "sum":          "Which number is 37 + 48?"  options: the sum and distractors off by
                       1, 2, 10 or 20, or its digits reversed (the slips a model makes)
  kind "alphabetical": "Which word comes first in alphabetical order?"  options: distinct words

The prompt is the question, the options one per line ("A) 85"), then `instruction`, as the user
turn of the chat template. The data set is generated from `seed` (the same on every machine) and
split into disjoint train / validation questions.

The verifier reads ONE final answer, so a reply cannot hedge: only the text after the LAST
"Answer:" counts, and it must be a single option letter, optionally in parentheses or followed by
")", "." or ":", and optionally followed by exactly that option's own text ("Answer: B) 85").
Anything else there ("A or B", "A, B", another option's text) is malformed (reward 0,
`malformed=True`), as is a reply with no "Answer:". Reward 1 for the right letter.
"""
from __future__ import annotations

import dataclasses
import random
import re
import string
from typing import Any, Mapping, Sequence

from dockyard.envs.base import Environment, Reward

KINDS = ("sum", "alphabetical")
_WORDS = ("amber", "basil", "birch", "cedar", "cobalt", "coral", "delta", "ember", "fern", "fjord",
          "garnet", "ginger", "harbor", "hazel", "indigo", "iris", "jade", "juniper", "kelp", "lemon",
          "lumen", "maple", "marble", "nectar", "nutmeg", "olive", "onyx", "pepper", "pine", "quartz",
          "quill", "raven", "river", "saffron", "sage", "tundra", "tulip", "umber", "velvet", "violet",
          "willow", "wren", "xenon", "yarrow", "yew", "zephyr", "zinc")
_ANSWER = re.compile(r"Answer:", re.IGNORECASE)
_FINAL = re.compile(r"\s*\(?([A-Za-z])(?![A-Za-z])\)?[.):]?(.*)", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class ChoiceConfig:
  seed: int = 0
  kinds: tuple[str, ...] = KINDS
  num_choices: int = 4
  num_train: int = 200
  num_validation: int = 100
  instruction: str = "End your reply with 'Answer: <letter>'."

  def __post_init__(self):
    bad = [k for k in self.kinds if k not in KINDS]
    if not self.kinds or bad:
      raise ValueError(f"env.choice.kinds must be a non-empty subset of {list(KINDS)}, got {self.kinds}")
    if not 2 <= self.num_choices <= 8:
      raise ValueError(f"env.choice.num_choices must be in [2, 8], got {self.num_choices}")
    if self.num_train < 1 or self.num_validation < 0:
      raise ValueError(f"env.choice.num_train must be >= 1 and num_validation >= 0, got "
                       f"{self.num_train}, {self.num_validation}")

  @classmethod
  def from_config(cls, config) -> "ChoiceConfig":
    c = config.env.choice
    return cls(seed=int(c.seed), kinds=tuple(c.kinds), num_choices=int(c.num_choices),
               num_train=int(c.num_train), num_validation=int(c.num_validation),
               instruction=str(c.instruction))


def _sum_question(rng: random.Random, n: int) -> tuple[str, str, list[str]]:
  a, b = rng.randint(10, 99), rng.randint(10, 99)
  right = a + b
  slips = {right + 1, right - 1, right + 2, right - 2, right + 10, right - 10, right + 20,
           int(str(right)[::-1])}
  slips.discard(right)
  wrong = rng.sample(sorted(slips), n - 1)
  return f"Which number is {a} + {b}?", str(right), [str(w) for w in wrong]


def _alphabetical_question(rng: random.Random, n: int) -> tuple[str, str, list[str]]:
  words = rng.sample(_WORDS, n)
  right = min(words)
  return "Which word comes first in alphabetical order?", right, [w for w in words if w != right]


_MAKERS = {"sum": _sum_question, "alphabetical": _alphabetical_question}


def make_dataset(cfg: ChoiceConfig) -> tuple[list[dict], list[dict]]:
  """(train, validation): distinct questions (question + options), deterministic in the config."""
  rng = random.Random(f"choice-{cfg.seed}")
  need = cfg.num_train + cfg.num_validation
  tasks, seen = [], set()
  for _ in range(need * 50):
    if len(tasks) == need:
      break
    kind = cfg.kinds[len(tasks) % len(cfg.kinds)]
    question, right, wrong = _MAKERS[kind](rng, cfg.num_choices)
    options = [right] + wrong
    rng.shuffle(options)
    key = (question, frozenset(options))
    if key in seen:
      continue
    seen.add(key)
    tasks.append(dict(instance_id=f"choice-{kind}-{len(tasks):05d}", kind=kind, question=question,
                      options=options, answer=string.ascii_uppercase[options.index(right)]))
  if len(tasks) < need:
    raise ValueError(f"env.choice: only {len(tasks)} distinct questions of kinds {cfg.kinds}, "
                     f"{need} asked (num_train + num_validation)")
  return tasks[:cfg.num_train], tasks[cfg.num_train:]


def parse_choice(completion: str, options: Sequence[str]) -> tuple[str | None, str]:
  """(the letter after the last "Answer:", '') or (None, why the reply is malformed)."""
  found = list(_ANSWER.finditer(completion))
  if not found:
    return None, "no 'Answer:' in the completion"
  rest = completion[found[-1].end():]
  m = _FINAL.match(rest)
  if not m:
    return None, f"no option letter after the last 'Answer:' ({rest.strip()[:40]!r})"
  letter = m.group(1).upper()
  index = string.ascii_uppercase.find(letter)
  if not 0 <= index < len(options):
    return None, f"{letter!r} is not an option (A-{string.ascii_uppercase[len(options) - 1]})"
  tail = m.group(2).strip().rstrip(".").strip()
  if tail and tail.lower() != str(options[index]).lower():
    return None, f"more than one option letter after the last 'Answer:' ({rest.strip()[:40]!r})"
  return letter, ""


class ChoiceEnv(Environment):
  """Scores multiple-choice answers in-process; reward 1 for the right letter (module docstring)."""

  def __init__(self, cfg: ChoiceConfig | None = None):
    self.cfg = cfg or ChoiceConfig()

  def prompt_messages(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
    lines = [task["question"]] + [f"{string.ascii_uppercase[i]}) {o}" for i, o in enumerate(task["options"])]
    if self.cfg.instruction:
      lines.append(self.cfg.instruction)
    return [{"role": "user", "content": "\n".join(lines)}]

  def gold_completion(self, task: Mapping[str, Any]) -> str:
    return f"Answer: {task['answer']}"

  async def score(self, task: Mapping[str, Any], completion: str) -> Reward:
    letter, reason = parse_choice(completion, task["options"])
    if letter is None:
      return Reward(0.0, info=dict(reason=reason), components=dict(correct=0.0, format=0.0), malformed=True)
    correct = float(letter == task["answer"])
    return Reward(correct, info=dict(parsed=letter, answer=task["answer"]),
                  components=dict(correct=correct, format=1.0))

  def validation_metrics(self, rewards: Sequence[Reward]) -> dict[str, float]:
    n = max(len(rewards), 1)
    return dict(accuracy=sum(r.value for r in rewards) / n,
                malformed_fraction=sum(r.malformed for r in rewards) / n)
