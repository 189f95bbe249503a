"""Multi-turn agent episodes as GRPO groups: what the trajectory sources train on when the config
has an `agent` section (`dockyard.grpo.source.make_source`).

`EpisodeGroups.group(task, sampling)` plays `grpo.num_generations_per_prompt` episodes of the task
concurrently (`dockyard.agent.episode.run_group`, each in its own sandbox session by default) and
returns one scored `Group`: a completion per episode whose `token_ids` are everything after the
first prompt (the model's turns and the tool results between them, token for token as the engine
saw them), with the per-token `loss_mask` (1 on the model's tokens, all 0 for a masked episode)
and per-token generation logprobs and weight versions; its reward is the episode's, penalties
included. So the loss, the importance-sampling correction (per token) and the async buffer's age
bound (the oldest generated token's version) apply to each generated segment unchanged.

Validation stays single-shot (`env.score` on one completion); reward shaping's overlong penalty
counts tool-result tokens too, so agent configs bound length with `agent.*` instead.
"""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Mapping, Sequence

from dockyard.agent.episode import (AgentConfig, Episode, SessionExecutor, ToolExecutor,
                                    episode_metrics, run_group)
from dockyard.agent.oracle import play_oracle
from dockyard.agent.tools import SESSION_TOOLS, Tool
from dockyard.agent.trajectory import ChatRenderer
from dockyard.grpo.batch import Group
from dockyard.grpo.harness import max_in_flight
from dockyard.rollout.base import Completion, Generator, SamplingParams
from dockyard.sandbox.client import SessionLost

# Tries per group when a sandbox session is lost mid-episode (its executor restarted or went away).
MAX_GROUP_ATTEMPTS = 3


def episode_completion(ep: Episode, tokenizer) -> Completion:
  """One episode as a completion of its first prompt (an empty one, which trains nothing, when the
  episode ended before its first turn: its time or context was gone)."""
  t = ep.trajectory
  versions, last = [], t.weight_versions[t.generated[0][0]] if t.generated else ep.weight_version
  for v in t.weight_versions:   # template tokens carry the version of the turn before them
    last = v if v >= 0 else last
    versions.append(last)
  return Completion(prompt_ids=list(t.prompt_ids), token_ids=list(t.token_ids),
                    logprobs=list(t.logprobs), finish_reason="length" if ep.truncated else "stop",
                    weight_version=min(versions, default=ep.weight_version),
                    text=tokenizer.decode(t.token_ids),
                    token_weight_versions=versions, loss_mask=list(t.loss_mask))


def episode_group(task: Mapping[str, Any], episodes: Sequence[Episode], tokenizer) -> Group:
  """A scored group of one task's episodes (all of them start from the same prompt)."""
  prompts = {tuple(e.trajectory.prompt_ids) for e in episodes}
  if len(prompts) != 1:
    raise ValueError(f"the episodes of {task.get('instance_id', '?')!r} start from {len(prompts)} "
                     "different prompts")
  completions = [episode_completion(e, tokenizer) for e in episodes]
  return Group(task=task, prompt_ids=list(episodes[0].trajectory.prompt_ids), completions=completions,
               texts=[c.text for c in completions], rewards=[e.reward for e in episodes])


class EpisodeGroups:
  """Plays and scores groups of episodes for the trajectory sources; `metrics()` reports the
  episodes played since it was last called (`agent/*`: turns, tool use, endings, times).

  By default each episode acts in a sandbox session the env opens (`env.open_session(task)`)
  with the session's tools; `open_executor` and `tools` replace both. At most
  `env.code.max_in_flight` episodes (64 for envs without it) are alive at once, over all groups:
  each holds a session until it is graded."""

  def __init__(self, config, *, generator: Generator, env, tokenizer,
               open_executor: Callable[[Mapping[str, Any]], Awaitable[ToolExecutor]] | None = None,
               tools: Sequence[Tool] = SESSION_TOOLS):
    self.agent = AgentConfig.from_config(config.agent)
    self.n = int(config.grpo.num_generations_per_prompt)
    self.generator, self.env, self.tokenizer = generator, env, tokenizer
    if open_executor is None and not hasattr(env, "open_session"):
      raise ValueError(f"config.agent is set but the environment {type(env).__name__} opens no "
                       "sandbox sessions (it has no open_session(task)) for the agent to act in")
    self.open_executor = open_executor or self._open_session
    self.renderer = ChatRenderer(tokenizer, tools)
    self.config = config
    self._played: list[Episode] = []
    self._lost = 0
    self.max_in_flight = max_in_flight(config)
    self.slots = asyncio.Semaphore(self.max_in_flight)

  async def _open_session(self, task: Mapping[str, Any]) -> ToolExecutor:
    return SessionExecutor(await self.env.open_session(task))

  async def group(self, task: Mapping[str, Any], sampling: SamplingParams, n: int | None = None) -> Group:
    """The task's n episodes (`grpo.num_generations_per_prompt` unless given), played concurrently
    and graded, as one scored group. A lost session loses its group's episodes: they are played
    again, up to MAX_GROUP_ATTEMPTS times."""
    for attempt in range(MAX_GROUP_ATTEMPTS):
      try:
        episodes = await run_group(self.generator, self.open_executor, self.renderer, task,
                                   self.env.prompt_messages(task), n or self.n, sampling, self.agent,
                                   self.slots)
        break
      except SessionLost:
        self._lost += 1
        if attempt == MAX_GROUP_ATTEMPTS - 1:
          raise
    self._played.extend(episodes)
    return episode_group(task, episodes, self.tokenizer)

  def metrics(self) -> dict[str, float]:
    played, self._played = self._played, []
    lost, self._lost = self._lost, 0
    return {**episode_metrics(played), "agent/lost_groups": float(lost)}

  async def groups(self, tasks: Sequence[Mapping[str, Any]], sampling: SamplingParams,
                   n: int | None = None) -> list[Group]:
    """`group` for each task, concurrently (validation and eval: n episodes per task)."""
    return list(await asyncio.gather(*[self.group(t, sampling, n=n) for t in tasks]))

  async def play_oracle(self, tasks: Sequence[Mapping[str, Any]]) -> tuple[list[Episode], list[str]]:
    """The tasks' reference solutions played as episodes in sessions (`dockyard.agent.oracle`):
    those their grader passes, and the instance ids of the others. For an SFT warm start on the
    token trajectories the episodes train on; nothing is added to `metrics()`."""
    if not hasattr(self.env, "oracle_turns"):
      raise ValueError(f"grpo.sft_warmup.steps > 0 with an agent config needs oracle episodes, and "
                       f"the environment {type(self.env).__name__} has no oracle_turns(task); set "
                       f"grpo.sft_warmup.steps=0")
    return await play_oracle(self.env, self.tokenizer, tasks, self.renderer, self.agent,
                             self.open_executor, int(self.config.rollout.max_new_tokens),
                             self.max_in_flight)
