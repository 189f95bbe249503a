"""One multi-turn episode: the model and a tool executor take turns under budgets.

Each turn the whole trajectory so far (token ids, `dockyard.agent.trajectory`) goes to
`Generator.agenerate` with the tool call's end as a stop string, so generation stops at the end of
a call (vLLM's prefix caching, on by default and checked in tests/rollout/test_agent_stop_strings.py,
keeps turn k+1 from recomputing turn k; the saving is not measured here). The turn's call is parsed and validated (`dockyard.agent.tools`); a bad one gets
its error message as the tool result and counts toward `invalid_action_penalty`; a good one runs
on the `ToolExecutor`. The episode ends
when the model calls a tool that ends it (submit), answers without a call, or runs out of a
budget: turns, context tokens, one turn's `max_tokens` (its answer was cut), or wall time (each
command is also capped at `command_timeout_s`). Then `ToolExecutor.finish` grades what the agent
left, penalties are applied, and truncated episodes are masked or penalized as configured.

`ToolExecutor` is the seam to whatever the tools act on: `SessionExecutor` drives a live sandbox
session (`dockyard.sandbox.client.AgentSession`); tests drive episodes with a scripted model.
`run_group` runs a task's n episodes concurrently on the running event loop (as many groups as
the caller gathers run side by side).
"""
from __future__ import annotations

import abc
import asyncio
import collections
import contextlib
import dataclasses
import time
from typing import Any, Awaitable, Callable, Mapping, Sequence

import numpy as np

from dockyard.agent.tools import (CALL_END, SESSION_TOOLS, InvalidCall, Tool, ToolCall,
                                  completion_calls, find_tool, parse_call)
from dockyard.agent.trajectory import (ChatRenderer, TemplateNotPrefixStable, Trajectory,
                                       TrajectoryBuilder)
from dockyard.envs.base import Reward
from dockyard.rollout.base import Generator, SamplingParams
from dockyard.sandbox.client import SessionToolError

TRUNCATIONS = ("mask", "penalize")
# How an episode ended; the last four are truncations.
ENDINGS = ("submitted", "answered", "template_unstable", "max_turns", "max_context_tokens",
           "turn_max_tokens", "episode_timeout")
TRUNCATED = ENDINGS[3:]


@dataclasses.dataclass
class AgentConfig:
  """Budgets and penalties of an episode (the config's `agent` section)."""
  max_turns: int = 16                  # model turns; the last one's call runs, its result is not shown
  max_context_tokens: int = 4096       # the whole trajectory (prompt, turns, tool results)
  command_timeout_s: float = 30.0      # the most one tool call may run (a bash call may ask for less)
  episode_timeout_s: float = 600.0     # wall clock for generation and tools, grading excluded
  max_tool_output_chars: int = 4000    # a longer tool result keeps its head and tail
  warn_turns_left: int = 0             # tell the agent "N turns left" in results when N <= this
  invalid_action_penalty: float = 0.0  # subtracted from the reward per invalid call (>= 0)
  truncation: str = "mask"             # mask: a truncated episode trains nothing | penalize
  truncation_penalty: float = 0.0      # subtracted from a truncated episode's reward (penalize)

  def __post_init__(self):
    for name in ("max_turns", "max_context_tokens", "max_tool_output_chars"):
      if int(getattr(self, name)) < 1:
        raise ValueError(f"agent.{name} must be >= 1, got {getattr(self, name)}")
    for name in ("command_timeout_s", "episode_timeout_s"):
      if not float(getattr(self, name)) > 0:
        raise ValueError(f"agent.{name} must be > 0, got {getattr(self, name)}")
    for name in ("warn_turns_left", "invalid_action_penalty", "truncation_penalty"):
      if getattr(self, name) < 0:
        raise ValueError(f"agent.{name} must be >= 0, got {getattr(self, name)}")
    if self.truncation not in TRUNCATIONS:
      raise ValueError(f"agent.truncation must be one of {TRUNCATIONS}, got {self.truncation!r}")

  @classmethod
  def from_config(cls, section: Mapping[str, Any]) -> "AgentConfig":
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(section) - fields)
    if unknown:
      raise ValueError(f"agent: unknown keys {unknown}; known: {sorted(fields)}")
    return cls(**dict(section))


@dataclasses.dataclass
class ToolResult:
  text: str
  error: bool = False   # the tool ran and refused (a failed edit, a missing file): not an invalid call


class ToolExecutor(abc.ABC):
  """What an episode's tool calls act on. `call` gets calls already validated against `tools`."""
  tools: Sequence[Tool]

  @abc.abstractmethod
  async def call(self, call: ToolCall, timeout_s: float) -> ToolResult:
    """Runs one call, for at most `timeout_s` seconds."""

  @abc.abstractmethod
  async def finish(self) -> Reward:
    """The episode is over: grades what the agent left (submitted or not)."""

  async def close(self) -> None:
    """Releases what the executor holds (after finish, or when the episode failed)."""


def _clip(text: str, limit: int) -> str:
  if len(text) <= limit:
    return text
  head, tail = limit // 2, limit - limit // 2
  return f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n{text[-tail:]}"


class SessionExecutor(ToolExecutor):
  """The tools of a live sandbox session: `bash` is the session's exec, view/edit/create/search
  its file tools; `finish` submits the working tree's diff, graded in a fresh checkout."""
  tools = SESSION_TOOLS

  def __init__(self, session):
    self.session = session

  async def call(self, call: ToolCall, timeout_s: float) -> ToolResult:
    args = dict(call.arguments)
    try:
      if call.name == "bash":
        cap = min(float(args.get("timeout", timeout_s)), timeout_s,
                  float(self.session.info.get("max_timeout_s", timeout_s)))
        return ToolResult(_format_exec(await self.session.exec(args["command"], timeout_s=cap), cap))
      return ToolResult((await self.session.tool(call.name, **args))["output"])
    except SessionToolError as e:
      return ToolResult(f"error: {e}", error=True)

  async def finish(self) -> Reward:
    verdict = await self.session.submit()
    return Reward(float(verdict.get("reward", 0.0)), info={"verdict": verdict})

  async def close(self) -> None:
    await self.session.close()


async def play_completion(executor: ToolExecutor, completion: str,
                          timeout_s: float = 600.0) -> Reward:
  """A single-shot completion in an agent's environment (validation of agent configs): its tool
  calls run in order on `executor` (up to a submit; invalid ones are skipped and counted), then
  `finish` grades what they left; the executor is closed. No call at all: malformed, reward 0."""
  try:
    calls = completion_calls(completion, executor.tools)
    if not calls:
      return Reward(0.0, {"reason": "no tool call in the completion"}, malformed=True)
    invalid = 0
    for call in calls:
      if isinstance(call, InvalidCall):
        invalid += 1
        continue
      if find_tool(executor.tools, call.name).ends_episode:
        break
      await executor.call(call, timeout_s)
    reward = await executor.finish()
    reward.info["invalid_calls"] = invalid
    return reward
  finally:
    await executor.close()


def _format_exec(run: Mapping[str, Any], timeout_s: float) -> str:
  head = (f"timed out after {timeout_s:g} s" if run.get("timed_out")
          else f"exit code: {run.get('exit_code')}")
  parts = [head]
  for stream in ("stdout", "stderr"):
    if run.get(stream):
      cut = " (truncated)" if run.get(f"{stream}_truncated") else ""
      parts.append(f"{stream}{cut}:\n{run[stream]}")
  return "\n".join(parts)


@dataclasses.dataclass
class Episode:
  """One finished episode: its trajectory and conversation, how it ended, its reward."""
  task: Mapping[str, Any]
  trajectory: Trajectory
  messages: list[dict]
  ending: str                          # one of ENDINGS
  reward: Reward                       # after penalties; reward.info["raw_reward"] is the executor's
  turns: int = 0
  invalid_calls: int = 0
  tool_errors: int = 0
  tool_counts: dict[str, int] = dataclasses.field(default_factory=dict)
  generate_s: float = 0.0
  env_s: float = 0.0
  masked: bool = False                 # loss mask all 0 (truncation='mask', or an unstable template)
  weight_version: int = 0              # the generator's when the episode started

  @property
  def truncated(self) -> bool:
    return self.ending in TRUNCATED


def derive_seed(seed: int | None, *keys: int) -> int | None:
  """A seed of its own for (seed, keys): a seeded group's episodes, and each of their turns, must
  not all draw the same random stream (identical episodes, identical turns)."""
  if seed is None:
    return None
  return int(np.random.SeedSequence([int(seed), *map(int, keys)]).generate_state(1)[0] % (2 ** 31))


async def run_episode(generator: Generator, executor: ToolExecutor, renderer: ChatRenderer,
                      task: Mapping[str, Any], messages: Sequence[Mapping[str, Any]],
                      sampling: SamplingParams, config: AgentConfig) -> Episode:
  """Plays one episode to its end and grades it; the executor is not closed here."""
  if [t.name for t in renderer.tools] != [t.name for t in executor.tools]:
    raise ValueError(f"the renderer's tools {[t.name for t in renderer.tools]} are not the "
                     f"executor's {[t.name for t in executor.tools]}")
  deadline = time.monotonic() + config.episode_timeout_s
  started_on = generator.weight_version
  builder = TrajectoryBuilder(renderer, messages)
  traj = builder.trajectory
  counts: collections.Counter = collections.Counter()
  invalid = errors = turns = 0
  generate_s = env_s = 0.0
  ending = "max_turns"
  while turns < config.max_turns:
    room = config.max_context_tokens - len(traj)
    if room <= 0:
      ending = "max_context_tokens"
      break
    left = deadline - time.monotonic()
    if left <= 0:
      ending = "episode_timeout"
      break
    params = dataclasses.replace(sampling, max_tokens=min(sampling.max_tokens, room),
                                 seed=derive_seed(sampling.seed, turns),
                                 stop=tuple(dict.fromkeys(tuple(sampling.stop) + (CALL_END,))))
    t0 = time.perf_counter()
    try:
      [completion] = await asyncio.wait_for(generator.agenerate(traj.ids, 1, params), left)
    except asyncio.TimeoutError:
      ending = "episode_timeout"
      break
    finally:
      generate_s += time.perf_counter() - t0
    versions = completion.token_weight_versions or [completion.weight_version] * len(completion.token_ids)
    text = builder.add_turn(completion.token_ids, completion.logprobs, versions)
    turns += 1
    if completion.finish_reason == "length":
      ending = "max_context_tokens" if len(completion.token_ids) >= room else "turn_max_tokens"
      break
    call = parse_call(text, executor.tools)
    if call is None:
      ending = "answered"
      break
    if isinstance(call, InvalidCall):
      invalid += 1
      result = call.message
    else:
      counts[call.name] += 1
      if find_tool(executor.tools, call.name).ends_episode:
        ending = "submitted"
        break
      left = deadline - time.monotonic()
      if left <= 0:
        ending = "episode_timeout"
        break
      t0 = time.perf_counter()
      try:
        done = await asyncio.wait_for(executor.call(call, min(config.command_timeout_s, left)),
                                      left + 30.0)
      except asyncio.TimeoutError:
        ending = "episode_timeout"
        break
      finally:
        env_s += time.perf_counter() - t0
      errors += done.error
      result = done.text
    if turns >= config.max_turns:
      break   # ending stays max_turns: the call ran, nobody reads its result
    result = _clip(result, config.max_tool_output_chars)
    if 0 < config.max_turns - turns <= config.warn_turns_left:
      result += f"\n[{config.max_turns - turns} turns left]"
    try:
      ids = builder.observation_ids(result)
    except TemplateNotPrefixStable:
      ending = "template_unstable"
      break
    if len(traj) + len(ids) >= config.max_context_tokens:
      ending = "max_context_tokens"   # no room left to answer the result
      break
    builder.add_observation(ids, result)

  t0 = time.perf_counter()
  raw = await executor.finish()
  env_s += time.perf_counter() - t0
  value = raw.value - config.invalid_action_penalty * invalid
  masked = ending == "template_unstable"
  if ending in TRUNCATED:
    if config.truncation == "mask":
      masked = True
    else:
      value -= config.truncation_penalty
  if masked:
    traj.mask_all()
  reward = dataclasses.replace(raw, value=value, info=dict(raw.info, raw_reward=raw.value,
                                                           ending=ending))
  return Episode(task=task, trajectory=traj, messages=builder.messages, ending=ending,
                 reward=reward, turns=turns, invalid_calls=invalid, tool_errors=errors,
                 tool_counts=dict(counts), generate_s=generate_s, env_s=env_s, masked=masked,
                 weight_version=started_on)


async def run_group(generator: Generator, open_executor: Callable[[Mapping[str, Any]], Awaitable[ToolExecutor]],
                    renderer: ChatRenderer, task: Mapping[str, Any],
                    messages: Sequence[Mapping[str, Any]], n: int, sampling: SamplingParams,
                    config: AgentConfig, slots: asyncio.Semaphore | None = None) -> list[Episode]:
  """`n` episodes of one task, concurrently, each with its own executor (closed when it ends)
  and, when `sampling` is seeded, its own seed. If one raises, the others are cancelled (their
  executors closed) and the error propagates. `slots`, shared by the groups of a step, bounds the
  episodes (so the sandbox sessions) alive at once across them."""
  if n < 1:
    raise ValueError(f"run_group: n must be >= 1, got {n}")

  async def one(i: int) -> Episode:
    async with slots or contextlib.nullcontext():
      executor = await open_executor(task)
      try:
        own = dataclasses.replace(sampling, seed=derive_seed(sampling.seed, i))
        return await run_episode(generator, executor, renderer, task, messages, own, config)
      finally:
        await executor.close()

  tasks = [asyncio.ensure_future(one(i)) for i in range(n)]
  try:
    return list(await asyncio.gather(*tasks))
  except BaseException:   # one failed (a lost session): stop the others and close their executors
    for t in tasks:
      t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    raise


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
  """Turns, tool use, invalid calls, endings, env vs generate time, tokens: means over episodes."""
  if not episodes:
    return {}
  n = len(episodes)
  calls = sum(sum(e.tool_counts.values()) + e.invalid_calls for e in episodes)
  out = {
      "agent/turns": sum(e.turns for e in episodes) / n,
      "agent/invalid_call_rate": sum(e.invalid_calls for e in episodes) / max(calls, 1),
      "agent/tool_error_rate": sum(e.tool_errors for e in episodes) / max(calls, 1),
      "agent/truncated_fraction": sum(e.truncated for e in episodes) / n,
      "agent/masked_fraction": sum(e.masked for e in episodes) / n,
      "agent/template_unstable": float(sum(e.ending == "template_unstable" for e in episodes)),
      "agent/tokens": sum(len(e.trajectory) for e in episodes) / n,
      "agent/generated_tokens": sum(b - a for e in episodes for a, b in e.trajectory.generated) / n,
      "agent/generate_s": sum(e.generate_s for e in episodes) / n,
      "agent/env_s": sum(e.env_s for e in episodes) / n,
  }
  for ending in ENDINGS:
    out[f"agent/ending/{ending}"] = sum(e.ending == ending for e in episodes) / n
  for name in sorted({k for e in episodes for k in e.tool_counts}):
    out[f"agent/calls/{name}"] = sum(e.tool_counts.get(name, 0) for e in episodes) / n
  return out
