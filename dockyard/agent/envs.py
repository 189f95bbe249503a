"""Environments for multi-turn agents (a config with an `agent` section): their prompts ask for
tool calls, `open_session(task)` is where an episode acts (training, and the GRPO loop's
validation: one episode per held-out task), and `score` (single-shot: a completion scored alone,
as configs/eval.py does) runs one completion's tool calls in a fresh session (`play_completion`)
and grades what they left.
They live here, not in dockyard.envs, because they build on the agent's tools and episodes.

`SweAgentEnv`: the SWE tasks; the prompt is the issue alone (the agent reads the code in its
session), and submit grades the diff by the held-out tests in a fresh checkout (reward: the
verdict's, resolved and zeroed by an integrity finding). Its oracle (`swe_oracle_calls`) is the
gold patch as an agent would make it: for each hunk, `view` the lines around it, then one `edit`
whose `old_str` is the hunk's removed lines with the fewest context lines (at least
`gold_context`) that make it occur exactly once in the file; then submit.

`TerminalEnv`: Terminal-Bench-style shell tasks (`dockyard.data.terminal`) played in sandbox
sessions; the task's checker, run after the episode, is the reward.

An agent episode (`configs/terminal.py`, the config's `agent` section) opens a session on the
task (`open_session`): the executor builds the starting directory from the task's files, runs its
setup, and serves the session's tools in /testbed; `submit` (or the episode's end) runs the
checker in a fresh sandbox over the directory the agent left, from the host-side task record, so
the agent can neither read nor replace it, and whatever it wrote outside /testbed is gone (each
command's /tmp and $HOME are its own). Reward: 1 when the checker exits 0, else 0.

`oracle_calls` is a terminal task's reference solution as the agent's tool calls (bash commands,
then submit); `oracle_turns` renders them as the model's turns, which the SFT warm start plays as
episodes in sessions (`dockyard.agent.oracle`), and `gold_completion` as one completion.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import unidiff

from dockyard.agent.episode import SessionExecutor, play_completion
from dockyard.agent.tools import ToolCall, format_call
from dockyard.envs.base import Environment, Reward
from dockyard.envs.swe import SweEnv, shorten_issue

SWE_SYSTEM_PROMPT = (
    "You fix bugs in a Python repository checked out at /testbed. Explore it and run its tests "
    "with the tools (one call per turn; every command starts in /testbed), edit the code to fix "
    "the issue, then call submit: your changes are graded by held-out tests.")

TERMINAL_SYSTEM_PROMPT = (
    "You are an agent working in a Linux shell sandbox. Your working directory is /testbed: every "
    "command starts there (cd does not carry over; chain steps with &&) and only what is under "
    "/testbed counts. Do the task with the tools, one call per turn, then call submit.")


class SweAgentEnv(SweEnv):
  """The SWE env for an agent: prompts with the issue alone (cut to `issue_token_budget` tokens
  when > 0); `score` plays a completion's calls in a session, then its submit grades the diff."""

  def prompt_messages(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
    issue = shorten_issue(task["problem_statement"], self.count_tokens, self.issue_budget)
    user = (f"Repository: {task['repo']} (at /testbed)\n\nIssue:\n{issue}\n\nFix the issue, then "
            "call submit.")
    return [{"role": "system", "content": SWE_SYSTEM_PROMPT}, {"role": "user", "content": user}]

  def is_success(self, reward: Reward) -> bool:
    """Resolved and not zeroed by an integrity finding: from `score`'s info, or an episode's verdict
    (before the episode's penalties)."""
    verdict = reward.info.get("verdict") or {}
    resolved = reward.info.get("resolved", verdict.get("resolved"))
    return bool(resolved) and float(reward.info.get("raw_reward", reward.value)) > 0

  def validation_metrics(self, rewards) -> dict[str, float]:
    n = max(len(rewards), 1)
    rates = [r.info.get("pass_rate", (r.info.get("verdict") or {}).get("pass_rate")) for r in rewards]
    return {"resolve_rate": sum(self.is_success(r) for r in rewards) / n,
            "malformed_fraction": sum(r.malformed for r in rewards) / n,
            "pass_rate": sum(float(p or 0.0) for p in rates) / n}

  def oracle_turns(self, task: Mapping[str, Any]) -> list[str]:
    """The gold patch as the model's turns (view and edit per hunk, then submit), which an agent
    config's SFT warm start plays in a session (`dockyard.agent.oracle`)."""
    return [format_call(c) for c in swe_oracle_calls(task["patch"], self._reader(task), self.gold_context)]

  def gold_completion(self, task: Mapping[str, Any]) -> str:
    """The oracle's calls as one completion (what `score` plays)."""
    return "\n".join(self.oracle_turns(task))

  async def score(self, task: Mapping[str, Any], completion: str) -> Reward:
    reward = await play_completion(SessionExecutor(await self.open_session(task)), completion)
    verdict = reward.info.get("verdict") or {}
    reward.info.update(resolved=bool(verdict.get("resolved")), pass_rate=verdict.get("pass_rate", 0.0),
                       findings=verdict.get("findings") or [])
    return reward


def swe_oracle_calls(patch: str, read: Callable[[str], str | None], context: int = 1,
                     view_margin: int = 2) -> list[ToolCall]:
  """A unified diff as an agent's calls: per hunk, `view` its lines (± `view_margin`), then `edit`
  with the hunk's changed lines and the fewest surrounding context lines (>= `context`, within the
  hunk) that make `old_str` occur exactly once in the file as the earlier edits left it; `submit`
  last. `read(path)` returns a file at the base commit (None: a new file, written with `create`).
  Raises ValueError when even the whole hunk does not occur exactly once."""
  calls: list[ToolCall] = []
  for f in unidiff.PatchSet(patch):
    path = f.path
    if f.is_removed_file:
      calls.append(ToolCall("bash", {"command": f"rm {path}"}))
      continue
    text = None if f.is_added_file else read(path)
    if text is None:
      content = "".join(ln.value for h in f for ln in h if not ln.is_removed)
      calls.append(ToolCall("create", {"path": path, "content": content}))
      continue
    for h in f:
      lines = list(h)
      changed = [i for i, ln in enumerate(lines) if not ln.is_context]
      if not changed:
        continue
      for c in range(context, len(lines) + 1):
        lo, hi = max(0, changed[0] - c), min(len(lines), changed[-1] + c + 1)
        old = "".join(ln.value for ln in lines[lo:hi] if not ln.is_added)
        if old and text.count(old) == 1:
          break
        if lo == 0 and hi == len(lines):
          raise ValueError(f"{path}: hunk {h.source_start} does not occur exactly once in the file")
      new = "".join(ln.value for ln in lines[lo:hi] if not ln.is_removed)
      start = max(1, text[:text.index(old)].count("\n") + 1 - view_margin)
      end = start + old.count("\n") + 2 * view_margin - 1
      calls += [ToolCall("view", {"path": path, "start": start, "end": end}),
                ToolCall("edit", {"path": path, "old_str": old, "new_str": new})]
      text = text.replace(old, new, 1)
  return calls + [ToolCall("submit", {})]


def oracle_calls(task: Mapping[str, Any]) -> list[ToolCall]:
  """The task's reference solution as tool calls: each oracle command a `bash` call, then submit."""
  return [ToolCall("bash", {"command": c}) for c in task["oracle"]] + [ToolCall("submit", {})]


def oracle_turns(task: Mapping[str, Any]) -> list[str]:
  """The model's turns of an oracle episode (what an SFT warm start on oracle trajectories trains on)."""
  return [format_call(c) for c in oracle_calls(task)]


class TerminalEnv(Environment):
  """Terminal tasks in sessions of one `SandboxClient`."""

  def __init__(self, client):
    self.client = client

  def prompt_messages(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
    return [{"role": "system", "content": TERMINAL_SYSTEM_PROMPT},
            {"role": "user", "content": task["instruction"]}]

  async def open_session(self, task: Mapping[str, Any]):
    """A live session in the task's starting directory; its submit runs the checker."""
    return await self.client.open_session(dict(task))

  def gold_completion(self, task: Mapping[str, Any]) -> str:
    return "\n".join(oracle_turns(task))

  def oracle_turns(self, task: Mapping[str, Any]) -> list[str]:
    """The reference solution as the model's turns (an agent config's SFT warm start plays them
    in a session: `dockyard.agent.oracle`)."""
    return oracle_turns(task)

  def is_success(self, reward: Reward) -> bool:
    """The checker passed: an episode's reward before its penalties (invalid calls) where it has one."""
    return float(reward.info.get("raw_reward", reward.value)) >= 1.0

  async def score(self, task: Mapping[str, Any], completion: str) -> Reward:
    return await play_completion(SessionExecutor(await self.open_session(task)), completion)

  def validation_metrics(self, rewards: Sequence[Reward]) -> dict[str, float]:
    n = max(len(rewards), 1)
    return {"success_rate": sum(self.is_success(r) for r in rewards) / n,
            "malformed_fraction": sum(r.malformed for r in rewards) / n}

  async def close(self) -> None:
    await self.client.aclose()
