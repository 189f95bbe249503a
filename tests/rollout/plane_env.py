"""An environment and env factories for tests/rollout/test_data_plane.py, in a module of their own
so that the experience worker (another process) can import them by name."""
from __future__ import annotations

from dockyard.envs.base import Environment, Reward

TASKS = [dict(instance_id=f"t{i}", question=f"say {i} {i + 1}", extra=(i, "x")) for i in range(4)]


class TextEnv(Environment):
  """A reward that is a function of the completion's text: scoring the wrong text shows."""

  def prompt_messages(self, task):
    return [{"role": "user", "content": task["question"]}]

  async def score(self, task, completion):
    return Reward(value=(sum(map(ord, completion)) % 97) / 97.0, info={"reason": f"{task['instance_id']}:{len(completion)}"},
                  malformed=len(completion) % 3 == 0)


def text_env(tokenizer):
  return TextEnv(), TASKS


def other_tasks_env(tokenizer):
  return TextEnv(), TASKS[:2]
