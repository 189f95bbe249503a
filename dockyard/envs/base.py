"""The `Environment` seam: a task and a completion in, a reward out.

Environments are async so that many scorings can be in flight (the SWE env waits on the sandbox).
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any, Mapping, Sequence


@dataclasses.dataclass
class Reward:
  value: float                                 # the raw reward, before shaping
  info: dict[str, Any] = dataclasses.field(default_factory=dict)  # reason, verdict, findings...
  components: dict[str, float] = dataclasses.field(default_factory=dict)  # for multi-reward (GDPO)
  malformed: bool = False                      # the completion could not be parsed

  def to_json(self) -> dict[str, Any]:
    """JSON-able fields (`Reward(**d)` reads them back); what JSON cannot hold in `info` (the env
    may report anything there) is kept as its repr."""
    return dict(value=float(self.value), components={k: float(v) for k, v in self.components.items()},
                malformed=bool(self.malformed),
                info={k: v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)
                      for k, v in self.info.items()})


class Environment(abc.ABC):

  @abc.abstractmethod
  def prompt_messages(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
    """Chat messages for the task (the tokenizer's chat template turns them into ids)."""

  @abc.abstractmethod
  async def score(self, task: Mapping[str, Any], completion: str) -> Reward:
    """Scores one completion of the task."""

  def gold_completion(self, task: Mapping[str, Any]) -> str:
    """A completion that solves the task (the SFT warm start's target)."""
    raise NotImplementedError(f"{type(self).__name__} has no gold_completion(task); the SFT warm "
                              f"start (grpo.sft_warmup.steps > 0) needs one, or set "
                              f"grpo.sft_warmup.steps=0")

  def validation_metrics(self, rewards: Sequence[Reward]) -> dict[str, float]:
    """Env-specific validation figures over one reward per held-out task (logged as `val/<key>`)."""
    return {}

  def is_success(self, reward: Reward) -> bool:
    """Whether a scored completion solves its task (pass@k counts these); envs whose reward is
    not 0/1 correctness override it."""
    return reward.value >= 1.0

  async def close(self) -> None:
    """Releases clients and connections."""
