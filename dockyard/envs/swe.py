"""The single-shot SWE environment: a task's prompt in, one completion's patch graded by the sandbox out.

Prompt = the problem statement (cut to `env.code.issue_token_budget` when set) + the relevant source files of the repository at `base_commit`.
Which files: the files the task's gold patch edits (SWE-bench's "oracle" retrieval), read from the
local task repository with `git show base_commit:path`. The budget (`env.code.prompt_token_budget`,
in tokens of the policy's tokenizer) is spent file by file; a file that does not fit whole is cut
to windows of lines around the gold hunks (with line numbers kept so the model can write correct
hunks), and files that still do not fit are left out. Held-out tests are never shown.

Scoring: the completion's unified diff is extracted (`patch_extract`), submitted through
`SandboxClient`, and the verdict's `reward` (binary resolved, zero on any integrity finding) or
`pass_rate` (also zeroed by a finding) is the raw reward. A completion without a parsable diff is
malformed: reward 0, `malformed=True`, the reason in `info` (shaping adds the configured penalty).
"""
from __future__ import annotations

import os
import subprocess
from typing import Any, Callable, Mapping

import unidiff

from dockyard.data import repos
from dockyard.envs import patch_extract
from dockyard.envs.base import Environment, Reward

SYSTEM_PROMPT = (
    "You fix bugs in Python repositories. Answer with a unified diff (git format, paths relative to "
    "the repository root, a/ and b/ prefixes) inside one ```diff fenced block.")


def gold_hunk_lines(gold_patch: str) -> dict[str, list[tuple[int, int]]]:
  """{path: [(first_line, last_line)]} of the pre-image lines each gold hunk covers."""
  spans: dict[str, list[tuple[int, int]]] = {}
  for f in unidiff.PatchSet(gold_patch):
    for h in f:
      spans.setdefault(f.source_file[2:] if f.source_file.startswith("a/") else f.source_file, []).append(
          (h.source_start, h.source_start + max(h.source_length, 1) - 1))
  return spans


def _windows(lines: list[str], spans: list[tuple[int, int]], radius: int) -> str:
  keep: list[tuple[int, int]] = []
  for lo, hi in sorted(spans):
    lo, hi = max(1, lo - radius), min(len(lines), hi + radius)
    if keep and lo <= keep[-1][1] + 1:
      keep[-1] = (keep[-1][0], max(keep[-1][1], hi))
    else:
      keep.append((lo, hi))
  parts = []
  for lo, hi in keep:
    parts.append(f"... (lines {lo}-{hi})\n" + "\n".join(lines[lo - 1:hi]))
  return "\n".join(parts) + "\n..."


def shorten_issue(text: str, count_tokens: Callable[[str], int], budget: int,
                  line_chars: int = 100) -> str:
  """`text` cut to about `budget` tokens: long lines (tracebacks, reprs) first cut to `line_chars`,
  then lines dropped from the end. The head holds the title, the failing test and its check."""
  text = text.strip()
  if budget <= 0 or count_tokens(text) <= budget:
    return text
  lines = [ln if len(ln) <= line_chars else ln[:line_chars] + " ..." for ln in text.split("\n")]
  while len(lines) > 1 and count_tokens("\n".join(lines)) > budget:
    lines.pop()
  return "\n".join(lines) + "\n..."


def build_prompt(task: Mapping[str, Any], read_file: Callable[[str], str | None],
                 count_tokens: Callable[[str], int], budget: int,
                 issue_budget: int = 0) -> list[dict[str, str]]:
  """Chat messages for `task` with the gold-patch files fitted into `budget` tokens (the issue
  first cut to `issue_budget` tokens when that is > 0, so the code keeps some room)."""
  issue = shorten_issue(task["problem_statement"], count_tokens, issue_budget)
  header = f"Repository: {task['repo']}\n\nIssue:\n{issue}\n"
  used = count_tokens(SYSTEM_PROMPT) + count_tokens(header) + 32
  sections = []
  spans = gold_hunk_lines(task["patch"]) if task.get("patch") else {}
  for path, file_spans in spans.items():
    text = read_file(path)
    if text is None:
      continue
    whole = f"\n[start of {path}]\n{text.rstrip()}\n[end of {path}]\n"
    cost = count_tokens(whole)
    if used + cost <= budget:
      sections.append(whole); used += cost
      continue
    lines = text.split("\n")
    for radius in (40, 20, 10, 5, 2):
      cut = f"\n[start of {path} (excerpt)]\n{_windows(lines, file_spans, radius)}\n[end of {path}]\n"
      cost = count_tokens(cut)
      if used + cost <= budget:
        sections.append(cut); used += cost
        break
  user = header + "\nRelevant code:\n" + "".join(sections) + "\nWrite the patch that fixes the issue."
  return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


class SweEnv(Environment):
  """Scores patches through one `SandboxClient` (many scorings in flight)."""

  def __init__(self, client, count_tokens: Callable[[str], int], prompt_token_budget: int = 1024,
               reward: str = "resolved", repos_dir: str | None = None, gold_context: int = 1,
               issue_token_budget: int = 0):
    if reward not in ("resolved", "pass_rate"):
      raise ValueError(f"env.code.reward must be 'resolved' or 'pass_rate', got {reward!r}")
    self.client = client
    self.count_tokens = count_tokens
    self.budget = prompt_token_budget
    self.reward = reward
    self.repos_dir = repos_dir or repos.default_repos_dir()
    self.gold_context = gold_context
    self.issue_budget = issue_token_budget

  def _reader(self, task: Mapping[str, Any]) -> Callable[[str], str | None]:
    root = os.path.join(self.repos_dir, repos.repo_dirname(task["repo"]))

    def read(path: str) -> str | None:
      out = subprocess.run(["git", "-C", root, "show", f"{task['base_commit']}:{path}"],
                           capture_output=True, text=True)
      return out.stdout if out.returncode == 0 else None
    return read

  def prompt_messages(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
    return build_prompt(task, self._reader(task), self.count_tokens, self.budget, self.issue_budget)

  def gold_completion(self, task: Mapping[str, Any]) -> str:
    """The SFT warm start's target: the gold patch, compacted (`patch_extract.compact_patch`: no
    `index` line, `gold_context` lines of context), in the answer format the prompt asks for."""
    return f"```diff\n{patch_extract.compact_patch(task['patch'], self.gold_context)}```"

  def is_success(self, reward: Reward) -> bool:
    """Resolved (and not zeroed by an integrity finding), whatever env.code.reward trains on."""
    return bool(reward.info.get("resolved")) and reward.value > 0

  def validation_metrics(self, rewards) -> dict[str, float]:
    n = max(len(rewards), 1)
    return {"resolve_rate": sum(self.is_success(r) for r in rewards) / n,
            "malformed_fraction": sum(r.malformed for r in rewards) / n,
            "pass_rate": sum(float(r.info.get("pass_rate") or 0.0) for r in rewards) / n}

  async def score(self, task: Mapping[str, Any], completion: str) -> Reward:
    got = patch_extract.extract_patch(completion)
    if got.patch is None:
      return Reward(0.0, {"reason": got.reason}, malformed=True)
    verdict = await self.client.run({**task, "patch": got.patch})
    findings = verdict.get("findings") or []
    if self.reward == "resolved":
      value = float(verdict.get("reward", float(verdict.get("resolved", False))))
    else:
      value = float(verdict.get("pass_rate", 0.0))
    if findings:
      value = 0.0
    return Reward(value, {"resolved": bool(verdict.get("resolved")), "findings": findings,
                          "reason": verdict.get("reason", ""), "pass_rate": verdict.get("pass_rate", 0.0),
                          "patch_applied": verdict.get("patch_applied")})

  async def open_session(self, task: Mapping[str, Any]):
    """A live sandbox session on the task's base commit, for a multi-turn agent episode
    (`dockyard.grpo.episodes`): an `AgentSession` whose submit grades like `score`."""
    return await self.client.open_session(task)

  async def close(self) -> None:
    await self.client.aclose()
