"""Oracle episodes: a task's reference solution played as the model's turns in a real session, so
that an SFT warm start of an agent config trains on exactly the token trajectories its episodes
produce (the prompt with the tools, each call, each real tool result between them), not on one
completion with every call joined.

`OracleGenerator` stands in for the model: its k-th turn is the k-th of the task's oracle turns
(`env.oracle_turns(task)`: text ending at a call's end), returned as token ids the way the engine
returns a turn that stopped at the call's end. `play_oracle` runs `run_episode` with it over each
task (a session each, at most `max_in_flight` at once) and keeps the episodes that the task's own
grader passes; the others are reported, never trained on.
"""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Mapping, Sequence

from dockyard.agent.episode import AgentConfig, Episode, ToolExecutor, run_episode
from dockyard.agent.trajectory import ChatRenderer
from dockyard.rollout.base import Completion, Generator, SamplingParams


class OracleGenerator(Generator):
  """Answers turn k of an episode with `turns[k]`'s token ids (logprob 0; `finish_reason` 'stop',
  or 'length' past `max_tokens`, as the engine would)."""

  def __init__(self, tokenizer, turns: Sequence[str]):
    self.tokenizer, self.turns, self.next_turn = tokenizer, list(turns), 0
    self.vocab_size = len(tokenizer)

  async def agenerate(self, prompt_ids, n, sampling):
    return self.generate([prompt_ids], n, sampling)[0]

  def generate(self, prompt_ids, n, sampling):
    if self.next_turn >= len(self.turns):
      raise RuntimeError(f"the oracle has {len(self.turns)} turns; the episode asked for another")
    ids = self.tokenizer.encode(self.turns[self.next_turn], add_special_tokens=False)
    self.next_turn += 1
    finish = "stop"
    if len(ids) > sampling.max_tokens:
      ids, finish = ids[:sampling.max_tokens], "length"
    return [[Completion(prompt_ids=list(prompt), token_ids=list(ids), logprobs=[0.0] * len(ids),
                        finish_reason=finish, weight_version=0) for _ in range(n)]
            for prompt in prompt_ids]

  def update_weights(self, named_tensors, version):
    raise NotImplementedError("the oracle has no weights")

  def prepare_for_generation(self):
    pass

  @property
  def weight_version(self) -> int:
    return 0


async def play_oracle(env, tokenizer, tasks: Sequence[Mapping[str, Any]], renderer: ChatRenderer,
                      agent: AgentConfig, open_executor: Callable[[Mapping[str, Any]], Awaitable[ToolExecutor]],
                      max_tokens: int, max_in_flight: int = 16) -> tuple[list[Episode], list[str]]:
  """(the oracle episodes that pass their task's grader, in task order; the instance ids of those
  that did not: a reference solution that fails, or an episode cut by a budget)."""
  slots = asyncio.Semaphore(max(1, max_in_flight))
  sampling = SamplingParams(temperature=0.0, max_tokens=int(max_tokens))

  async def one(task) -> Episode:
    async with slots:
      executor = await open_executor(task)
      try:
        return await run_episode(OracleGenerator(tokenizer, env.oracle_turns(task)), executor, renderer,
                                 task, env.prompt_messages(task), sampling, agent)
      finally:
        await executor.close()

  episodes = await asyncio.gather(*[one(t) for t in tasks])
  good = [env.is_success(e.reward) and not e.masked for e in episodes]
  return ([e for e, ok in zip(episodes, good) if ok],
          [str(e.task.get("instance_id", "?")) for e, ok in zip(episodes, good) if not ok])
